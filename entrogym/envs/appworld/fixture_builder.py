"""Build a small AppWorld world offline, with appworld's own code only.

Run inside ``.venv-appworld`` (it imports ``appworld``, which needs pydantic<2)::

    .venv-appworld/bin/python entrogym/envs/appworld/fixture_builder.py DIR

It writes ``DIR/data`` in the layout that ``appworld download data`` produces (api_docs,
base_dbs, tasks/<id>/{specs.json,dbs,ground_truth}, datasets/<split>.txt), so the real
``AppWorld`` class, its environment server, its evaluator and ``appworld verify tasks`` all
run on it unchanged. The tasks are ours (the real data cannot be downloaded here); every
other piece — the apps, their databases, the API docs, the test tracker — is appworld's.

This file must stay importable without entrogym (it runs in the other virtualenv) and must
set ``APPWORLD_ROOT`` before appworld is imported: appworld caches its paths on import.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from fixture_tasks import SCENARIOS, SPLITS, SUPERVISOR, Scenario  # noqa: E402  (sibling module)

APPS_WITH_ACCOUNTS = {
    "simple_note": "email",
    "todoist": "email",
    "phone": "phone_number",
    "spotify": "email",
}


def _write_json(obj: object, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


class _AppWorld:
    """The appworld symbols the builder uses, imported once ``APPWORLD_ROOT`` is set
    (appworld caches its paths on import)."""

    def __init__(self) -> None:
        from appworld.apps import get_all_apps
        from appworld.apps.admin.models import MainUserMunch
        from appworld.apps.api_lib import set_local_date_and_time, set_local_dbs
        from appworld.collections.api_docs import ApiDocCollection
        from appworld.collections.models import ModelCollection
        from appworld.common.constants import CANARY_STRING, DB_VERSION, DEFAULT_SYSTEM_DATETIME
        from appworld.common.utils import import_models_module
        from appworld.task import Task

        # The clock is frozen before anything else of appworld runs, as appworld's own setup does.
        self.freezer = set_local_date_and_time(DEFAULT_SYSTEM_DATETIME)
        self.all_apps = get_all_apps()
        self.MainUserMunch, self.ApiDocCollection = MainUserMunch, ApiDocCollection
        self.ModelCollection, self.Task = ModelCollection, Task
        self.set_local_dbs = set_local_dbs
        self.import_models_module = import_models_module
        self.canary, self.db_version, self.when = CANARY_STRING, DB_VERSION, DEFAULT_SYSTEM_DATETIME

    def models(self) -> dict:
        """Each app's models module, bound to the databases set up last."""
        return {app: self.import_models_module(app) for app in self.all_apps}


def build(root: str) -> dict:
    """Build the fixture world under ``root/data``; return a summary dict."""
    root = os.path.abspath(root)
    os.environ["APPWORLD_ROOT"] = root  # before appworld is imported (_AppWorld does it)
    start = time.time()
    data = os.path.join(root, "data")
    if os.path.exists(data):
        shutil.rmtree(data)
    os.makedirs(data)
    aw = _AppWorld()
    api_docs = _write_api_docs(aw, data)
    _write_base_dbs(aw, data, api_docs)
    task_ids = _write_tasks(aw, data)
    _write_datasets(data, task_ids)
    aw.freezer.stop()
    return {
        "root": root,
        "splits": task_ids,
        "num_tasks": sum(len(v) for v in task_ids.values()),
        "apps": sorted({s.app for s in SCENARIOS}),
        "seconds": round(time.time() - start, 2),
    }


def _write_api_docs(aw: _AppWorld, data: str):
    """API docs in the two formats appworld reads. ``ApiDocCollection.save()`` also writes the
    openapi format, which needs openapi_spec_validator (absent; its new versions break
    appworld), so write them ourselves, exactly as save() does."""
    api_docs = aw.ApiDocCollection.build()
    for app_name, name_to_doc in api_docs.items():
        docs = {name: dict(doc) | {"canary_string": aw.canary} for name, doc in name_to_doc.items()}
        _write_json(docs, os.path.join(data, "api_docs", "standard", f"{app_name}.json"))
        fc_docs = api_docs.copy().keep_apps([app_name]).function_calling()
        for doc in fc_docs:
            doc["canary_string"] = aw.canary
        _write_json(fc_docs, os.path.join(data, "api_docs", "function_calling", f"{app_name}.json"))
    return api_docs


def _write_base_dbs(aw: _AppWorld, data: str, api_docs) -> None:
    """Every app gets a (possibly empty) database; the supervisor gets accounts, an address,
    and the shared catalogue data that tasks refer to (spotify songs and artists)."""
    base = os.path.join(data, "base_dbs")
    os.makedirs(base)
    aw.set_local_dbs(to_db_home_path=base, from_db_home_path=base, app_names=aw.all_apps,
                     create=True)  # fmt: skip
    m = aw.models()
    for app_name, name_to_doc in api_docs.items():
        if app_name == "admin":
            continue
        for doc in name_to_doc.values():
            m["api_docs"].ApiDoc.create_save(
                app_name_=app_name, api_name=doc["api_name"], path=doc["path"],
                method=doc["method"], description=doc["description"],
                parameters=doc["parameters"], response_schemas=doc["response_schemas"],
            )  # fmt: skip
    _add_supervisor(m)
    for scenario in SCENARIOS:
        if scenario.base is not None:
            scenario.base(m)
    for app_name in aw.all_apps:
        m[app_name].SQLModel.db.engine.dispose()


def _add_supervisor(m: dict) -> None:
    sup = SUPERVISOR
    person = {k: sup[k] for k in ("first_name", "last_name", "email", "phone_number", "birthday")}
    m["admin"].MainUser.create_save(**person, sex=sup["sex"])
    supervisor = m["supervisor"].Supervisor.create_save(**person, sex=sup["sex"])
    for app_name, login_by in APPS_WITH_ACCOUNTS.items():
        password = sup["passwords"][app_name]
        m["supervisor"].AccountPassword.create_save(
            supervisor_id=supervisor.id, account_name=app_name, password=password
        )
        user = {"first_name": sup["first_name"], "last_name": sup["last_name"],
                "password": password, login_by: sup[login_by]}  # fmt: skip
        if login_by == "email":
            user["verified"] = True
        m[app_name].User.create_save(**user)
    m["supervisor"].Address.create_save(supervisor_id=supervisor.id, **sup["address"])


def _write_tasks(aw: _AppWorld, data: str) -> dict[str, list[str]]:
    """Each task: the base DBs loaded into memory plus the task's records, saved as changes."""
    supervisor = aw.MainUserMunch(
        **{k: SUPERVISOR[k] for k in ("first_name", "last_name", "email", "phone_number")}
    )
    task_ids: dict[str, list[str]] = {split: [] for split in SPLITS}
    for scenario in SCENARIOS:
        for number, variant in enumerate(scenario.variants, start=1):
            task_id = f"{scenario.id}_{number}"
            private = _write_task_dbs(aw, data, task_id, scenario, variant, supervisor)
            _write_ground_truth(aw, data, task_id, scenario, variant, private)
            task_ids[scenario.split].append(task_id)
    return task_ids


def _write_datasets(data: str, task_ids: dict[str, list[str]]) -> None:
    for split, ids in task_ids.items():
        path = os.path.join(data, "datasets", f"{split}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(ids) + "\n")


def _write_task_dbs(
    aw: _AppWorld, data: str, task_id: str, scenario: Scenario, variant, supervisor_munch
) -> dict:
    """The task's databases and specs; returns the scenario's private data."""
    collection = aw.ModelCollection.load(
        to_db_home_path=f":memory:fixture-{task_id}",
        from_db_home_path=os.path.join(data, "base_dbs"),
        load_apps=aw.all_apps,
    )
    m = aw.models()
    supervisor = m["supervisor"].Supervisor.all()[0]
    instruction = scenario.instruction.format(**variant)
    m["supervisor"].Task.create_save(supervisor_id=supervisor.id, instruction=instruction)
    users = {app: m[app].User.all()[0] for app in APPS_WITH_ACCOUNTS}
    private = scenario.setup(m, users, variant) or {}
    task = aw.Task(
        id=task_id,
        instruction=instruction,
        supervisor=supervisor_munch,
        datetime=aw.when,
        allowed_apps=[a for a in aw.all_apps if a != "admin"],
        db_version=aw.db_version,
        model_collection=collection,
    )
    # One changes file per app, empty ones too: a missing file makes appworld open an
    # empty DB for that app and fail.
    task.save(save_ground_truth=False, model_collection_format="changes", delete_if_exists=True)
    collection.close()
    return private


def _write_ground_truth(
    aw: _AppWorld, data: str, task_id: str, scenario: Scenario, variant, private: dict
) -> None:
    gt = os.path.join(data, "tasks", task_id, "ground_truth")
    os.makedirs(gt, exist_ok=True)
    solution = scenario.solution(variant)
    files = {
        "metadata.json": {
            "mode": "full",
            "difficulty": scenario.difficulty,
            "num_solution_code_lines": len(solution.splitlines()) - 1,
            "num_apps": 1,
        },
        "public_data.json": {},
        "private_data.json": private,
        "answer.json": scenario.answer(variant, private),
        "test_data.json": [{"requirement": r, "label": label} for r, label, _ in scenario.tests],
        "required_apps.json": [scenario.app],
        "api_calls.json": [],
    }
    for name, obj in files.items():
        _write_json(obj, os.path.join(gt, name))
    header = f"# Canary String: {aw.canary}\n"
    for name, code in {
        "evaluation.py": scenario.evaluation(),
        "solution.py": solution,
        "compiled_solution.py": solution,
        "generator.py": "# Written by entrogym's fixture builder (entrogym/envs/appworld/fixture_tasks.py).",
    }.items():
        with open(os.path.join(gt, name), "w") as f:
            f.write(header + code + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: fixture_builder.py DIR", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(build(sys.argv[1])))
