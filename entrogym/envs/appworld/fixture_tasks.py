"""The fixture world's scenarios: instructions, data, reference solutions and unit tests.

Each scenario is an AppWorld "generator" (scenario id) with three task variants, ids
``<scenario>_<n>`` (AppWorld requires exactly one underscore). ``setup`` adds the task's
records to the in-memory copy of the base databases; ``tests`` become the task's
``evaluation.py`` (one ``with test(...)`` block each) and ``test_data.json`` (requirement +
label: ``no_op_pass`` if doing nothing passes it, else ``no_op_fail``).

Runs inside ``.venv-appworld`` only (imported by ``fixture_builder.py``); plain Python, no
appworld import at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPLITS = ("train", "dev", "test_normal", "test_challenge")

SUPERVISOR: dict[str, Any] = {
    "first_name": "Joyce",
    "last_name": "Weaver",
    "email": "joyce-weav@gmail.com",
    "phone_number": "3155673041",
    "birthday": "1991-07-12",
    "sex": "female",
    "passwords": {
        "simple_note": "Lq#2vTn8wP",
        "todoist": "Zx9!kFr4Qa",
        "phone": "Pm7$ueW3sD",
        "spotify": "Hb5&yNc6tR",
    },
    "address": {
        "name": "Home",
        "street_address": "42 Maple Street",
        "city": "Seattle",
        "state": "Washington",
        "country": "United States",
        "zip_code": 98101,
    },
}

LOGIN = """\
def solution(apis, requester):
    profile = apis.supervisor.show_profile()
    passwords = {{p["account_name"]: p["password"] for p in apis.supervisor.show_account_passwords()}}
    token = apis.{app}.login(username=profile["{login_by}"], password=passwords["{app}"])["access_token"]
"""

ANSWER_OF = "json.loads(models.end.supervisor.Task.all()[0].answer)"
NO_CHANGE = ("assert no model other than supervisor.Task was changed.", "no_op_pass",
             "test.case(models.changed_model_names(), '==', set())")  # fmt: skip
ANSWER = ("assert the answer matches the ground truth.", "no_op_fail",
          f"test.answer({ANSWER_OF}, ground_truth_answer)")  # fmt: skip
NO_ANSWER = ("assert the task was not answered with a value.", "no_op_pass",
             f"test.case({ANSWER_OF} in (None, '<<NOT_GIVEN>>'), '==', True)")  # fmt: skip


@dataclass
class Scenario:
    id: str
    app: str
    split: str
    difficulty: int
    instruction: str  # str.format fields from the variant
    variants: list[dict[str, Any]]
    setup: Callable[[dict, dict, dict], dict | None]  # (models, app users, variant) -> private data
    solution_body: str  # after LOGIN; <<key>> placeholders from the variant
    tests: list[tuple[str, str, str]]  # (requirement, label, body)
    answer: Callable[[dict, dict], Any] = lambda variant, private: None
    base: Callable[[dict], None] | None = None
    extra: dict = field(default_factory=dict)

    def solution(self, variant: dict) -> str:
        login_by = "phone_number" if self.app == "phone" else "email"
        code = LOGIN.format(app=self.app, login_by=login_by) + self.solution_body
        for key, value in variant.items():
            code = code.replace(f"<<{key}>>", str(value))
        return code

    def evaluation(self) -> str:
        lines = [
            "import json",
            "",
            "",
            "def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):",
        ]
        for requirement, _, body in self.tests:
            lines += [
                "    with test(",
                '        """',
                f"        {requirement}",
                '        """',
                "    ):",
            ]
            lines += [f"        {line}" for line in body.splitlines()]
        return "\n".join(lines)


# --- simple_note ---------------------------------------------------------------------------


def _notes(m: dict, users: dict, v: dict) -> dict:
    user = users["simple_note"]
    for i in range(v["n_tag"]):
        m["simple_note"].Note.create_save(
            user_id=user.id, title=f"{v['tag'].title()} note {i + 1}", content=f"About {v['tag']} #{i}",
            tags=[v["tag"], "misc"] if i % 2 else [v["tag"]],
        )  # fmt: skip
    for i in range(v["n_other"]):
        m["simple_note"].Note.create_save(
            user_id=user.id, title=f"Other note {i + 1}", content="Nothing to see.", tags=["other"]
        )
    return {"tag": v["tag"]}


NOTE_COUNT = Scenario(
    id="notecount",
    app="simple_note",
    split="train",
    difficulty=1,
    instruction="How many notes do I have in Simple Note tagged '{tag}'?",
    variants=[
        {"tag": "recipes", "n_tag": 3, "n_other": 2},
        {"tag": "travel", "n_tag": 7, "n_other": 4},
        {"tag": "work", "n_tag": 12, "n_other": 3},
    ],
    setup=_notes,
    solution_body="""\
    count, page = 0, 0
    while True:
        notes = apis.simple_note.search_notes(access_token=token, tags=["<<tag>>"], page_index=page, page_limit=20)
        if not notes:
            break
        count += len(notes)
        page += 1
    apis.supervisor.complete_task(answer=count)
""",
    tests=[NO_CHANGE, ANSWER],
    answer=lambda v, p: v["n_tag"],
)


def _existing_note(m: dict, users: dict, v: dict) -> dict:
    m["simple_note"].Note.create_save(
        user_id=users["simple_note"].id, title="Groceries", content="milk, eggs", tags=["home"]
    )
    return {"title": v["title"], "content": v["content"], "tag": v["tag"]}


NEW_NOTE = Scenario(
    id="newnote",
    app="simple_note",
    split="train",
    difficulty=1,
    instruction=(
        "Create a note in Simple Note titled '{title}' with the content '{content}' "
        "and the tag '{tag}'."
    ),
    variants=[
        {"title": "Gym plan", "content": "Squats on Monday", "tag": "health"},
        {"title": "Book list", "content": "Dune, Emma", "tag": "reading"},
        {"title": "Gift ideas", "content": "A scarf for Mia", "tag": "family"},
    ],
    setup=_existing_note,
    solution_body="""\
    apis.simple_note.create_note(access_token=token, title="<<title>>", content="<<content>>", tags=["<<tag>>"])
    apis.supervisor.complete_task()
""",
    tests=[
        (
            "assert only simple_note.Note was changed.",
            "no_op_fail",
            "test.case(models.changed_model_names(), '==', {'simple_note.Note'})",
        ),
        (
            "assert exactly one note was added, with the requested title, content and tag.",
            "no_op_fail",
            "added, updated, removed = models.changed_records('simple_note.Note')\n"
            "test.case((len(added), len(updated), len(removed)), '==', (1, 0, 0))\n"
            "test.case(added[0].title, '==', private_data['title'])\n"
            "test.case(added[0].content, '==', private_data['content'])\n"
            "test.case(added[0].tags, '==', [private_data['tag']])",
        ),
        NO_ANSWER,
    ],  # fmt: skip
)

# --- todoist -------------------------------------------------------------------------------


def _todo(m: dict, users: dict, v: dict) -> dict:
    user = users["todoist"]
    t = m["todoist"]
    target_id = None
    for name in ("Inbox", v["project"], "Errands"):
        project = t.Project.create_save(user_id=user.id, name=name, is_inbox=name == "Inbox")
        # show_projects lists the projects a user collaborates on, the creator included.
        t.ProjectCollaboratorLink.create_save(project_id=project.id, user_id=user.id)
        if name == "Inbox":
            continue
        for index, title in enumerate([v["title"], "Call the bank", "Water the plants"], start=1):
            task = t.Task.create_save(
                project_id=project.id,
                user_id=user.id,
                title=title,
                order_index=index,
                priority="medium",
            )
            if name == v["project"] and title == v["title"]:
                target_id = task.id
    return {"task_id": target_id}


DONE_TASK = Scenario(
    id="donetask",
    app="todoist",
    split="dev",
    difficulty=2,
    instruction="Mark the task '{title}' in my Todoist project '{project}' as completed.",
    variants=[
        {"project": "Home", "title": "Fix the sink"},
        {"project": "Work", "title": "Send the report"},
        {"project": "Garden", "title": "Plant tomatoes"},
    ],
    setup=_todo,
    solution_body="""\
    projects = apis.todoist.show_projects(access_token=token, query="<<project>>", page_limit=20)
    project = [p for p in projects if p["name"] == "<<project>>"][0]
    tasks = apis.todoist.show_tasks(project_id=project["project_id"], access_token=token)
    candidates = tasks["no_section_tasks"] + [t for s in tasks.get("sections", []) for t in s["tasks"]]
    task = [t for t in candidates if t["title"] == "<<title>>"][0]
    apis.todoist.update_task(task_id=task["task_id"], access_token=token, is_completed=True)
    apis.supervisor.complete_task()
""",
    tests=[
        (
            "assert only todoist.Task was changed.",
            "no_op_fail",
            "test.case(models.changed_model_names(), '==', {'todoist.Task'})",
        ),
        (
            "assert the requested task is marked completed.",
            "no_op_fail",
            "task = models.end.todoist.Task.find_one(id=private_data['task_id'])\n"
            "test.case(task.is_completed, '==', True)",
        ),
        (
            "assert no other task was added, removed or updated.",
            "no_op_pass",
            "added, updated, removed = models.changed_records('todoist.Task')\n"
            "test.case((len(added), len(removed)), '==', (0, 0))\n"
            "test.case({t.id for t in updated} - {private_data['task_id']}, '==', set())",
        ),
        NO_ANSWER,
    ],  # fmt: skip
)

# --- phone ---------------------------------------------------------------------------------

CONTACTS = [
    ("Mia", "Lopez", "2065550111"),
    ("Noah", "Kim", "2065550122"),
    ("Ava", "Patel", "2065550133"),
    ("Liam", "Brown", "2065550144"),
]


def _contacts(m: dict, users: dict, v: dict) -> dict:
    for first, last, number in CONTACTS:
        m["phone"].Contact.create_save(
            user_id=users["phone"].id, first_name=first, last_name=last, phone_number=number,
            email=f"{first.lower()}.{last.lower()}@example.com", relationships=["friend"],
        )  # fmt: skip
    return {}


CONTACT_NUMBER = Scenario(
    id="contactnum",
    app="phone",
    split="test_normal",
    difficulty=1,
    instruction="What is the phone number of my contact {first} {last}? Answer with the digits only.",
    variants=[{"first": c[0], "last": c[1], "number": c[2]} for c in CONTACTS[:3]],
    setup=_contacts,
    solution_body="""\
    contacts = apis.phone.search_contacts(access_token=token, query="<<first>> <<last>>", page_limit=20)
    contact = [c for c in contacts if c["first_name"] == "<<first>>" and c["last_name"] == "<<last>>"][0]
    apis.supervisor.complete_task(answer=contact["phone_number"])
""",
    tests=[NO_CHANGE, ANSWER],
    answer=lambda v, p: v["number"],
)


def _alarm(m: dict, users: dict, v: dict) -> dict:
    m["phone"].Alarm.create_save(
        user_id=users["phone"].id, time="06:00", label="Wake up", enabled=True
    )
    return {"time": v["time"], "label": v["label"]}


SET_ALARM = Scenario(
    id="setalarm",
    app="phone",
    split="test_normal",
    difficulty=1,
    instruction="Create an alarm on my phone at {time} labeled '{label}'.",
    variants=[
        {"time": "07:30", "label": "Yoga"},
        {"time": "18:45", "label": "Pick up kids"},
        {"time": "21:15", "label": "Take pills"},
    ],
    setup=_alarm,
    solution_body="""\
    apis.phone.create_alarm(access_token=token, time="<<time>>", label="<<label>>")
    apis.supervisor.complete_task()
""",
    tests=[
        (
            "assert only phone.Alarm was changed.",
            "no_op_fail",
            "test.case(models.changed_model_names(), '==', {'phone.Alarm'})",
        ),
        (
            "assert exactly one alarm was added, at the requested time and with the requested label.",
            "no_op_fail",
            "added, updated, removed = models.changed_records('phone.Alarm')\n"
            "test.case((len(added), len(updated), len(removed)), '==', (1, 0, 0))\n"
            "test.case(added[0].time, '==', private_data['time'])\n"
            "test.case(added[0].label, '==', private_data['label'])",
        ),
        NO_ANSWER,
    ],  # fmt: skip
)

# --- spotify -------------------------------------------------------------------------------

SONGS = [
    "Morning Light", "Blue Harbor", "Paper Moon", "Late Train", "Golden Hour", "Static Sky",
    "Quiet Storm", "Neon Rain", "Open Road", "Salt and Sea", "Ember", "Northern Lines",
]  # fmt: skip


def _catalogue(m: dict) -> None:
    from appworld.common.datetime import DateTime

    s = m["spotify"]
    artists = [s.Artist.create_save(name=n, genre="pop") for n in ("The Vales", "Ida Moss")]
    for i, title in enumerate(SONGS):
        s.Song.create_save(
            title=title, artist_ids=[artists[i % 2].id], duration=180 + i, genre="pop",
            release_date=DateTime(2020, 1 + i % 12, 1),
        )  # fmt: skip


def _library(m: dict, users: dict, v: dict) -> dict:
    s = m["spotify"]
    for song in s.Song.all()[: v["n"]]:
        s.UserLibrarySong.create_save(user_id=users["spotify"].id, song_id=song.id)
    return {}


LIBRARY_SONGS = Scenario(
    id="libsongs",
    app="spotify",
    split="test_challenge",
    difficulty=2,
    instruction="How many songs are in my Spotify song library?",
    variants=[{"n": 2}, {"n": 6}, {"n": 9}],
    setup=_library,
    solution_body="""\
    count, page = 0, 0
    while True:
        songs = apis.spotify.show_song_library(access_token=token, page_index=page, page_limit=20)
        if not songs:
            break
        count += len(songs)
        page += 1
    apis.supervisor.complete_task(answer=count)
""",
    tests=[NO_CHANGE, ANSWER],
    answer=lambda v, p: v["n"],
    base=_catalogue,
)


def _song_to_add(m: dict, users: dict, v: dict) -> dict:
    s = m["spotify"]
    s.UserLibrarySong.create_save(user_id=users["spotify"].id, song_id=s.Song.all()[0].id)
    return {"song_id": s.Song.find_one(title=v["title"]).id}


ADD_SONG = Scenario(
    id="addsong",
    app="spotify",
    split="test_challenge",
    difficulty=2,
    instruction="Add the song '{title}' to my Spotify song library.",
    variants=[{"title": "Paper Moon"}, {"title": "Neon Rain"}, {"title": "Ember"}],
    setup=_song_to_add,
    solution_body="""\
    songs = apis.spotify.search_songs(query="<<title>>", page_limit=20)
    song = [s for s in songs if s["title"] == "<<title>>"][0]
    apis.spotify.add_song_to_library(song_id=song["song_id"], access_token=token)
    apis.supervisor.complete_task()
""",
    tests=[
        (
            "assert only spotify.UserLibrarySong was changed.",
            "no_op_fail",
            "test.case(models.changed_model_names(), '==', {'spotify.UserLibrarySong'})",
        ),
        (
            "assert exactly the requested song was added to the library.",
            "no_op_fail",
            "added, updated, removed = models.changed_records('spotify.UserLibrarySong')\n"
            "test.case([r.song_id for r in added], '==', [private_data['song_id']])\n"
            "test.case((len(updated), len(removed)), '==', (0, 0))",
        ),
        NO_ANSWER,
    ],  # fmt: skip
)

SCENARIOS: list[Scenario] = [
    NOTE_COUNT, NEW_NOTE, DONE_TASK, CONTACT_NUMBER, SET_ALARM, LIBRARY_SONGS, ADD_SONG,
]  # fmt: skip
