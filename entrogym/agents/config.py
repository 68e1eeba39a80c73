"""The rollout settings ``train``, ``eval`` and the demo share: model, engine, sampling, budgets.

``TrainConfig`` and the eval command's config extend :class:`AgentConfig`, so every command
spells these options the same way (``--engine hf --engine-dtype fp32 --engine-urls URL ...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from entrogym.agents.engines import (
    DECODE_PATHS,
    ENGINE_KINDS,
    DecodePath,
    EngineKind,
    resolve_engine_dtype,
    resolve_engine_kind,
)
from entrogym.dtypes import ENGINE_DTYPE_NAMES, EngineDTypeName
from entrogym.envs.base import env_attr

TURN_BUDGET_RULES = ("truncate", "step")


def turn_budget_rule(env_id: str, env: Any, rule: str | None, default: str = "truncate") -> str:
    """``rule``, else the env's declared ``on_turn_budget``, else ``default``: what the agent
    does with a turn cut at the token budget, read the same way by training and evaluation."""
    if rule is not None:
        return rule
    rule = env_attr(env, "on_turn_budget", None) or default
    if rule not in TURN_BUDGET_RULES:
        raise ValueError(
            f"env {env_id!r} declares on_turn_budget={rule!r}; it must be one of "
            f"{list(TURN_BUDGET_RULES)}"
        )
    return rule


FeedbackRole = Literal["user", "tool"]
ToolFormatName = Literal["template", "json", "call"]


@dataclass
class AgentConfig:
    """How the policy is served and prompted.

    Args:
        model: built-in model name, local Hugging Face folder, or hub id.
        engine: rollout engine: ``vllm`` (in-process), ``vllm-server`` (``engine_urls``),
            ``hf``, or ``auto`` (the default): ``vllm`` where CUDA is available, else ``hf``
            (faster to start and lighter on the CPUs measured, docs/performance.md). A config
            holds the resolved kind.
        engine_urls: base URLs of running ``vllm serve`` instances (``vllm-server`` engine).
        engine_dtype: dtype of the rollout engine's weights: fp32, bf16, fp16 or ``auto`` (the
            default): bf16 where the engine's device computes it natively (CUDA with bf16, a
            CPU with ``avx512_bf16`` or ``amx_bf16``), else fp32. A config holds the resolved
            dtype (``auto`` only for ``engine_urls``, whose servers' own dtype applies). bf16
            on a CPU without native bf16 is refused.
        engine_decode: how the ``hf`` engine samples: ``generate`` (``transformers`` generate
            through peft's LoRA layers), ``static`` (the adapter merged into a sampling copy of
            the weights and a static KV cache, for Llama-style models: the same tokens under a
            seed in fp32) or ``static-cdf`` (the same path with an inverse-CDF draw: the same
            distribution, other tokens under a seed, faster on CPU; docs/rollouts.md). ``hf``
            only.
        request_timeout: seconds one request to a ``vllm serve`` may take before it is retried.
        max_lora_rank: largest LoRA rank the vLLM engines accept (None = the run's lora_rank).
        max_loras: adapters an engine keeps loaded at once (vLLM's ``--max-loras``; start your
            own ``vllm serve`` with at least this many). None = 1, and for a training run what
            it samples with: ``max_staleness + 1`` versions.
        max_num_seqs: most sequences an engine generates at once; more wait for the next batch.
            None = the ``hf`` engine's default, sized from the model and
            ``max_context_tokens`` (``entrogym.agents.engines.hf.hf_max_num_seqs``), and for
            the vLLM engines the rollout batch (tasks x samples).
        max_response_tokens: per-turn generation budget (paper: 4096 for AIME).
        max_turn_tokens: the per-turn token budget under its multi-turn name: when given, it
            sets max_response_tokens.
        max_context_tokens: whole-episode context limit (paper: 32K for AppWorld).
        max_turns: actions per episode (None = the env's own limit): the rollout ends an
            episode after this many turns, graded as the env grades a cut episode, and an env
            whose constructor takes ``max_turns`` gets it too, so its own limit follows.
        feedback_role: the chat role of the env's answers: ``user`` or ``tool`` (None = ``tool``
            for envs with tools, ``user`` for the others).
        tool_format: how an env's tools are shown to the model and its calls read:
            ``template`` (the chat template renders tools; Hermes ``<tool_call>`` blocks),
            ``json`` (the same blocks, tools listed in the system message) or ``call`` (one
            line per call, ``tool(arg="value")``). None = ``template`` where the chat template
            renders tools, else ``call`` (docs/envs.md).
        on_turn_budget: a turn that hits ``max_response_tokens``: ``truncate`` ends the episode
            as a failure (the paper's rule), ``step`` hands the cut text to the env and goes on.
            None = the env's declared ``on_turn_budget`` (the world and AppWorld declare
            ``step``), else ``truncate``: training and evaluation read it the same way.
        temperature: sampling temperature of rollouts.
        system_prompt: system message for the agent (None = the env's / template's default).
        chat_template: a Jinja chat template file for a tokenizer without one, or to replace
            the model's (None = the tokenizer's own).
        turn_rewards: take per-turn rewards: an env may pay a reward on every step (not only
            the last), an episode's reward is their sum, and training gives each turn's
            tokens the advantage of that turn's return-to-go (docs/algorithms.md). Off (the
            default): rewards are terminal and a reward paid before the last step is an env
            error.
    """

    model: str = "smollm2-135m-instruct"
    engine: EngineKind = "auto"
    engine_urls: list[str] = field(default_factory=list)
    engine_dtype: EngineDTypeName = "auto"
    engine_decode: DecodePath = "generate"
    request_timeout: float = 600.0
    max_lora_rank: int | None = None
    max_loras: int | None = None
    max_num_seqs: int | None = None
    max_response_tokens: int = 256
    max_turn_tokens: int | None = None
    max_context_tokens: int = 4096
    max_turns: int | None = None
    feedback_role: FeedbackRole | None = None
    tool_format: ToolFormatName | None = None
    on_turn_budget: Literal["truncate", "step"] | None = None
    temperature: float = 1.0
    system_prompt: str | None = None
    chat_template: str | None = None
    turn_rewards: bool = False

    def __post_init__(self) -> None:
        self.check_agent()

    def check_agent(self) -> None:
        """Reject bad values with a ValueError naming the option; resolve ``engine: auto`` and
        ``engine_dtype: auto``."""
        if self.engine not in ENGINE_KINDS:
            raise ValueError(f"engine must be one of {list(ENGINE_KINDS)}, got {self.engine!r}")
        if self.engine == "auto":
            self.engine = "vllm-server" if self.engine_urls else resolve_engine_kind("auto")
        if self.engine_dtype not in ENGINE_DTYPE_NAMES:
            raise ValueError(
                f"engine_dtype must be one of {list(ENGINE_DTYPE_NAMES)}, got {self.engine_dtype!r}"
            )
        self.engine_dtype = resolve_engine_dtype(self.engine_dtype, self.engine, self.engine_urls)
        if self.engine_decode not in DECODE_PATHS:
            raise ValueError(
                f"engine_decode must be one of {list(DECODE_PATHS)}, got {self.engine_decode!r}"
            )
        if self.engine_decode != "generate" and self.engine != "hf":
            raise ValueError(
                f"engine_decode {self.engine_decode!r} applies to the hf engine only, not "
                f"{self.engine!r}; add --engine hf or drop --engine-decode"
            )
        if self.engine_urls and self.engine != "vllm-server":
            raise ValueError(
                f"engine_urls is for the vllm-server engine, not {self.engine!r}; "
                "add --engine vllm-server or drop the URLs"
            )
        if not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if self.max_lora_rank is not None and self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1 or None, got {self.max_lora_rank}")
        if self.max_loras is not None and self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1 or None, got {self.max_loras}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1 or None, got {self.max_num_seqs}")
        if self.max_turn_tokens is not None:
            if self.max_turn_tokens < 1:
                raise ValueError(f"max_turn_tokens must be >= 1, got {self.max_turn_tokens}")
            self.max_response_tokens = self.max_turn_tokens
        if self.max_turns is not None and (isinstance(self.max_turns, bool) or self.max_turns < 1):
            raise ValueError(
                f"max_turns (--max-turns) must be >= 1 (actions per episode), got {self.max_turns}"
            )
        if self.feedback_role not in ("user", "tool", None):
            raise ValueError(f"feedback_role must be user or tool, got {self.feedback_role!r}")
        if self.tool_format not in ("template", "json", "call", None):
            raise ValueError(
                f"tool_format must be template, json or call, got {self.tool_format!r}"
            )
        for name in ("max_response_tokens", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_response_tokens > self.max_context_tokens:
            raise ValueError(
                f"max_response_tokens ({self.max_response_tokens}) exceeds max_context_tokens "
                f"({self.max_context_tokens}); raise the context or lower the response budget"
            )
        if self.on_turn_budget not in (*TURN_BUDGET_RULES, None):  # None: the env's rule
            raise ValueError(
                f"on_turn_budget must be one of {list(TURN_BUDGET_RULES)}, "
                f"got {self.on_turn_budget!r}"
            )
        if not self.temperature >= 0:  # NaN too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.chat_template is not None and not Path(self.chat_template).is_file():
            raise ValueError(
                f"chat_template {self.chat_template!r} is not a file; pass a Jinja template file"
            )

    def engine_kwargs(
        self,
        seed: int = 0,
        lora_rank: int | None = None,
        *,
        max_num_seqs: int | None = None,
        threads: int | None = None,
        max_loras: int = 1,
    ) -> dict[str, Any]:
        """Keyword arguments of ``make_engine(self.engine, self.model, **...)``.

        ``max_num_seqs`` (the rollout batch: tasks x K; sizes the KV cache) and ``threads``
        (CPU cores of the engine) go to the two vLLM engines only, when given; the
        ``max_num_seqs`` option, when set, goes to every engine this process starts and wins.
        ``max_loras`` (the adapters a run samples with) goes to every engine, and the
        ``max_loras`` option wins over it. ``engine_decode`` goes to the ``hf`` engine only.
        """
        kwargs: dict[str, Any] = {
            "dtype": self.engine_dtype,
            "max_model_len": self.max_context_tokens,
            "urls": self.engine_urls or None,
            "seed": seed,
            "request_timeout": self.request_timeout,
            "max_lora_rank": self.max_lora_rank or lora_rank or 16,
            "max_loras": self.max_loras or max_loras,
        }
        if self.engine == "hf":
            kwargs["decode"] = self.engine_decode
            if self.max_num_seqs is not None:
                kwargs["max_num_seqs"] = self.max_num_seqs
        if self.engine in ("vllm", "vllm-server") and not self.engine_urls:
            if (self.max_num_seqs or max_num_seqs) is not None:
                kwargs["max_num_seqs"] = self.max_num_seqs or max_num_seqs
            if threads is not None:
                kwargs["threads"] = threads
        return kwargs

    def agent_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``LLMAgent.from_model(self.model, **...)``: the turn options
        (budget, turns, roles, tool format) are read here, for every command. The turn-budget
        rule here is the one given, else ``truncate``: a command that knows its env passes
        ``turn_budget_rule(...)`` in its place."""
        return {
            "system_prompt": self.system_prompt,
            "max_turn_tokens": self.max_response_tokens,
            "max_context": self.max_context_tokens,
            "on_turn_budget": self.on_turn_budget or "truncate",
            "chat_template": self.chat_template,
            "max_turns": self.max_turns,
            "feedback_role": self.feedback_role,
            "tool_format": self.tool_format,
        }

    def env_kwargs_for(self, env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
        """``env_kwargs`` with ``max_turns`` added when it is set and the env's constructor takes
        it (its own limit then follows the option); the same keyword given two different ways
        is a ValueError."""
        kwargs = dict(env_kwargs)
        if self.max_turns is None:
            return kwargs
        from entrogym.envs.resolve import env_takes_keyword

        if not env_takes_keyword(env_id, "max_turns"):
            return kwargs
        if "max_turns" in kwargs and kwargs["max_turns"] != self.max_turns:
            raise ValueError(
                f"env keyword 'max_turns' given twice: --max-turns {self.max_turns} and "
                f"--env-kwargs max_turns={kwargs['max_turns']!r}; pass it once"
            )
        kwargs["max_turns"] = self.max_turns
        return kwargs
