"""What ``additional_config["diversed"]`` and a request's ``extra_args["diversed"]`` may say, checked, and the
verifiers they build (no vLLM import here).

An engine verifies against the DIVERSED mixture when its ``additional_config`` holds a ``"diversed"`` entry::

    {"diversed": {"target_weight": 0.5}}                       # static ensemble, nu = 0.5 p + 0.5 q
    {"diversed": {"head": "org/head-gsm8k", "revision": "v1"}} # DIVERSED head: w_t from DiversedHead.from_pretrained
    {"diversed": {"target_weight": 1.0,                        # lossless by default; requests may pick a head
                  "heads": {"gsm8k": "org/head-gsm8k", "xsum": {"head": "org/head-xsum", "revision": "v2"}}}}

Engine keys:

==================== ==========================================================================================
``target_weight``    the default rule's static weight on the target, in [0, 1] (``StaticEnsembleVerifier``; 1 is
                     lossless SD)
``mixing``           ``"probs"`` (default, the paper) or ``"logits"``; only with ``target_weight``
``head``             the default rule's head: a directory written by ``DiversedHead.save_pretrained`` or a Hub id
``revision``         the default head's Hub revision (only with ``head``)
``local_files_only`` do not reach the Hub for any head (``HF_HUB_OFFLINE=1`` does the same)
``heads``            more heads the engine loads for requests to choose, by name: ``{name: source}`` or
                     ``{name: {"head": source, "revision": rev}}``
``judges``           judges (``JudgeHead``, judge decoding) the engine loads for requests to choose, by name, in the
                     same form (``{name: {"judge": source, "revision": rev}}``)
==================== ==========================================================================================

Exactly one of ``target_weight`` and ``head`` (the default rule); a name in ``heads`` equal to ``head`` must name the
same source and revision. Heads may read hidden states
(``use_hidden_states=True``): the plugin hands them the target's and the draft's last-layer hidden states at the
verified positions; their recorded hidden sizes must be the engine's models' (:meth:`DiversedVllmSettings.build_rules`
checks).

A request picks its own rule with ``SamplingParams(extra_args={"diversed": {...}})`` (the OpenAI server: the same
object as ``"diversed"`` in the request body, ``extra_body`` of the OpenAI client)::

    {"target_weight": 1.0}          # lossless for this request
    {"target_weight": 0.3}          # static ensemble (``"mixing"`` may come with it)
    {"head": "gsm8k"}               # a head the engine loaded: a name in ``heads``, or the default head's source
    {"fuzzy": {"threshold": 0.1}}   # fuzzy SD (``FuzzyVerifier``; ``"divergence"`` may come with it)
    {"top_k_relaxed": {"top_k": 2, "delta": 0.5}}   # top-k relaxed acceptance (``TopKRelaxedVerifier``)
    {"judge": "arith"}              # judge decoding with a judge the engine loaded (``JudgeVerifier``, threshold 0.5)
    {"judge": {"name": "arith", "threshold": 0.7}}

The relaxed rules verify through the same mixture: fuzzy SD is one (``pi_t`` is ``q_t`` or ``p_t``), and top-k
relaxed acceptance is speculative sampling of its emitted law ``o_t`` (docs/method.md §9), so sampled requests follow
exactly what they follow under ``generate``. A greedy request keeps drafts while they are ``argmax pi_t`` (for top-k:
``argmax o_t``, where ``generate`` keeps any draft of the relaxed set). A judge is a mixture too: ``pi_t = q_t`` where
it fires on the target's state after the drafted token, else ``p_t``, which keeps what ``generate`` keeps, greedy and
sampled; a judge's recorded hidden size must be the target's (checked at start).

A request without it gets the engine's default rule. :func:`request_rule` checks the object, naming the bad key.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..heads.head import DiversedHead
from ..heads.hub import weights_digest
from ..heads.judge import JudgeHead
from ..verifiers.checks import is_real
from ..verifiers.ops import MIXING_SPACES
from ..verifiers.relaxed import FuzzyVerifier, JudgeVerifier, TopKRelaxedVerifier
from ..verifiers.rules import HeadVerifier, StaticEnsembleVerifier, Verifier

__all__ = [
    "CONFIG_KEY",
    "DiversedVllmSettings",
    "RequestRule",
    "VerificationRules",
    "request_rule",
    "settings_from_additional_config",
]

#: the key of vLLM's ``additional_config`` and of a request's ``extra_args`` this plugin reads
CONFIG_KEY = "diversed"
_KEYS = ("target_weight", "mixing", "head", "revision", "local_files_only", "heads", "judges")
_REQUEST_KEYS = ("target_weight", "mixing", "head", "fuzzy", "top_k_relaxed", "judge")
#: the relaxed rules a request may name, their keys (with defaults) and verifier (diversed_hf.verifiers.relaxed)
_RELAXED_RULES = {
    "fuzzy": ({"threshold": None, "divergence": "js"}, FuzzyVerifier),
    "top_k_relaxed": ({"top_k": None, "delta": None}, TopKRelaxedVerifier),
}
_EXAMPLE = '{"diversed": {"target_weight": 0.5}} or {"diversed": {"head": "<dir or repo id>"}}'
_REQUEST_EXAMPLE = '{"diversed": {"target_weight": 1.0}} or {"diversed": {"head": "<a head the engine loaded>"}}'
#: static-ensemble verifiers an engine keeps for the weights its requests ask for (the least recently used go first)
MAX_CACHED_RULES = 64


def _check_weight(where: str, value: Any) -> None:
    if not is_real(value) or math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(
            f'{where}["target_weight"] must be a number in [0, 1] (the weight on the target; 1 is lossless SD, 0 '
            f"accepts every draft), got {value!r}."
        )


def _check_mixing(where: str, mixing: Any, target_weight: Any) -> None:
    if target_weight is None and mixing != "probs":
        raise ValueError(
            f'{where}["mixing"] is for `target_weight`; a head mixes in its own config\'s space (`mixing` in its '
            f"config.json). Remove `mixing`, got {mixing!r}."
        )
    if mixing not in MIXING_SPACES:
        raise ValueError(f'{where}["mixing"] must be one of {MIXING_SPACES}, got {mixing!r}.')


def _named_heads(where: str, heads: Any, kind: str = "head") -> dict[str, tuple[str, str | None]]:
    """``heads`` (``judges`` for ``kind="judge"``) checked: ``{name: (source, revision)}``."""
    if heads is None:
        return {}
    group, writer = f"{kind}s", "DiversedHead" if kind == "head" else "JudgeHead"
    if not isinstance(heads, dict) or not heads:
        raise ValueError(
            f'{where}["{group}"] must be a non-empty JSON object {{name: source}} (source: a directory written by '
            f"{writer}.save_pretrained or a Hub repo id), got {heads!r}."
        )
    named = {}
    for name, entry in heads.items():
        key = f'{where}["{group}"][{name!r}]'
        if not isinstance(name, str) or not name:
            raise ValueError(f'{where}["{group}"] names must be non-empty strings, got {name!r}.')
        if isinstance(entry, str):
            entry = {kind: entry}
        if not isinstance(entry, dict):
            raise ValueError(
                f'{key} must be a {kind}\'s source or {{"{kind}": source, "revision": rev}}, got {entry!r}.'
            )
        unknown = sorted(set(entry) - {kind, "revision"})
        if unknown:
            raise ValueError(f"{key} has unknown keys {unknown}; the keys are {[kind, 'revision']}.")
        source, revision = entry.get(kind), entry.get("revision")
        if not isinstance(source, str) or not source:
            raise ValueError(f'{key}["{kind}"] must be a directory or a Hub repo id, got {source!r}.')
        if revision is not None and not isinstance(revision, str):
            raise ValueError(f'{key}["revision"] must be a string, got {revision!r}.')
        named[name] = (source, revision)
    return named


@dataclass(frozen=True)
class RequestRule:
    """One request's checked ``extra_args["diversed"]``: a static weight (``mixing`` with it) or a head's name."""

    target_weight: float | None = None
    mixing: str = "probs"
    head: str | None = None
    relaxed: tuple | None = None  # (rule name, ((key, value), ...)): a relaxed rule of _RELAXED_RULES
    judge: tuple | None = None  # (a loaded judge's name, threshold)


@dataclass(frozen=True)
class DiversedVllmSettings:
    """The checked ``additional_config["diversed"]`` of one engine."""

    target_weight: float | None = None
    mixing: str = "probs"
    head: str | None = None
    revision: str | None = None
    local_files_only: bool = False
    heads: dict | None = field(default=None, hash=False)
    judges: dict | None = field(default=None, hash=False)

    def __post_init__(self):
        where = f'additional_config["{CONFIG_KEY}"]'
        if (self.target_weight is None) == (self.head is None):
            raise ValueError(
                f"{where} must name exactly one of `target_weight` (a static ensemble) and `head` (a DIVERSED head), "
                f"got target_weight={self.target_weight!r}, head={self.head!r}. Example: {_EXAMPLE}."
            )
        if self.target_weight is not None:
            _check_weight(where, self.target_weight)
            if self.revision is not None:
                raise ValueError(f'{where}["revision"] is for a head; it means nothing with `target_weight`.')
        else:
            if not isinstance(self.head, str) or not self.head:
                raise ValueError(
                    f'{where}["head"] must be a directory written by DiversedHead.save_pretrained or a Hub repo id, '
                    f"got {self.head!r}."
                )
            if self.revision is not None and not isinstance(self.revision, str):
                raise ValueError(f'{where}["revision"] must be a string, got {self.revision!r}.')
        _check_mixing(where, self.mixing, self.target_weight)
        if not isinstance(self.local_files_only, bool):
            raise ValueError(f'{where}["local_files_only"] must be true or false, got {self.local_files_only!r}.')
        named = _named_heads(where, self.heads)
        _named_heads(where, self.judges, kind="judge")
        if self.head is not None and self.head in named and named[self.head] != (self.head, self.revision):
            source, revision = named[self.head]
            raise ValueError(
                f'{where}["heads"][{self.head!r}] is {source!r} (revision {revision!r}), but {where}["head"] '
                f"{self.head!r} (revision {self.revision!r}) makes that name the default head's: a request naming "
                f"{self.head!r} would get one head and the logs would name the other. Rename the entry in `heads`, or "
                "make it the same source and revision."
            )

    @property
    def head_sources(self) -> dict[str, tuple[str, str | None]]:
        """Every head the engine loads, by the name a request picks it with: ``{name: (source, revision)}`` (the
        default head goes by its source)."""
        sources = _named_heads(f'additional_config["{CONFIG_KEY}"]', self.heads)
        if self.head is not None:
            sources.setdefault(self.head, (self.head, self.revision))
        return sources

    @property
    def judge_sources(self) -> dict[str, tuple[str, str | None]]:
        """Every judge the engine loads, by name: ``{name: (source, revision)}``."""
        return _named_heads(f'additional_config["{CONFIG_KEY}"]', self.judges, kind="judge")

    def default_rule(self) -> RequestRule:
        if self.head is not None:
            return RequestRule(head=self.head)
        return RequestRule(target_weight=float(self.target_weight), mixing=self.mixing)

    def describe(self) -> str:
        """One line for the logs: the default rule and, for a head, where it came from."""
        if self.head is None:
            return f"static ensemble, target_weight={self.target_weight}, mixing={self.mixing!r}"
        revision = f"@{self.revision}" if self.revision else ""
        return f"DIVERSED head {self.head}{revision}"

    def build_rules(
        self, device: Any = "cpu", *, target_hidden_size: int | None = None, draft_hidden_size: int | None = None
    ) -> tuple["VerificationRules", str]:
        """Load every head and return the engine's rules and a line naming them for the logs.

        ``target_hidden_size`` / ``draft_hidden_size`` (the engine's models') are checked against each head that
        reads hidden states, so a head trained for another pair fails here, at start, and not on the first request.
        """
        heads, identities = {}, {}
        for name, (source, revision) in self.head_sources.items():
            head = DiversedHead.from_pretrained(
                source, revision=revision, local_files_only=self.local_files_only, device=device
            )
            config = head.config
            for kind, expected, recorded in (
                ("target", target_hidden_size, config.target_hidden_size),
                ("draft", draft_hidden_size, config.draft_hidden_size),
            ):
                if config.use_hidden_states and expected is not None and recorded != expected:
                    raise ValueError(
                        f'additional_config["{CONFIG_KEY}"]: the head {name!r} ({source}) reads the {kind}\'s hidden '
                        f"states of size {recorded}, but this engine's {kind} model has hidden size {expected}. Load "
                        "a head trained for this pair, or one on distribution features (use_hidden_states=False)."
                    )
            heads[name] = HeadVerifier(head)
            identities[name] = _head_identity(head, source)  # digests the weights: once per head
        judges = {}
        for name, (source, revision) in self.judge_sources.items():
            judge = JudgeHead.from_pretrained(
                source, revision=revision, local_files_only=self.local_files_only, map_location=str(device)
            ).to(device)
            if target_hidden_size is not None and judge.config.hidden_size != target_hidden_size:
                raise ValueError(
                    f'additional_config["{CONFIG_KEY}"]: the judge {name!r} ({source}) reads the target\'s hidden '
                    f"states of size {judge.config.hidden_size}, but this engine's target model has hidden size "
                    f"{target_hidden_size}. Load a judge trained for this target (training/train_judge.py)."
                )
            judges[name] = judge.eval()
        rules = VerificationRules(self, heads, judges=judges)
        identity = self.describe()
        if self.head is not None:
            identity += f" ({identities[self.head]})"
        extra = [
            f"{name if name == source else f'{name}={source}'}{'@' + revision if revision else ''} ({identities[name]})"
            for name, (source, revision) in self.head_sources.items()
            if name != self.head
        ]
        if extra:
            identity += "; requests may pick the heads " + "; ".join(extra)
        if judges:
            identity += "; requests may pick the judges " + "; ".join(
                f"{name}={source}" + (f"@{revision}" if revision else "") + f" (weights sha256="
                f"{weights_digest(judges[name])[:16]})"
                for name, (source, revision) in self.judge_sources.items()
            )
        return rules, identity

    def build_verifier(self, device: Any = "cpu", **sizes) -> tuple[Verifier, str]:
        """The default rule's verifier (whose ``verification_probs`` gives ``nu_t``) and the line for the logs."""
        rules, identity = self.build_rules(device, **sizes)
        return rules.default, identity


class VerificationRules:
    """An engine's verifiers: the default rule's, every head's and judge's (loaded once), and the static ensembles,
    relaxed rules and judge thresholds its requests ask for, the ``max_cached`` most recently used kept (a client may
    send any weight or threshold; requests of a batch that share a rule share its verifier and are verified
    together)."""

    def __init__(
        self,
        settings: DiversedVllmSettings,
        heads: dict[str, HeadVerifier],
        max_cached: int = MAX_CACHED_RULES,
        *,
        judges: dict[str, JudgeHead] | None = None,
    ):
        if isinstance(max_cached, bool) or not isinstance(max_cached, int) or max_cached < 1:
            raise ValueError(f"`max_cached` must be a positive integer, got {max_cached!r}.")
        self.settings = settings
        self.heads = heads
        self.judges = judges or {}
        self.max_cached = max_cached
        self._verifiers: OrderedDict[RequestRule, Verifier] = OrderedDict()  # static rules, least recently used first
        default = settings.default_rule()
        if default.head is not None:
            self.default = self.heads[default.head]
        else:
            self.default = StaticEnsembleVerifier(default.target_weight, mixing=default.mixing)

    @property
    def requires_hidden_states(self) -> bool:
        """Whether some rule of this engine reads hidden states (the plugin then keeps them): a head or a judge."""
        return bool(self.judges) or self.reads_draft_hidden

    @property
    def reads_draft_hidden(self) -> bool:
        """Whether some head of this engine reads the draft's hidden state (judges read the target's alone)."""
        return any(verifier.requires_hidden_states for verifier in self.heads.values())

    def verifier(self, rule: RequestRule) -> Verifier:
        if rule.head is not None:
            return self.heads[rule.head]
        if rule == self.settings.default_rule():
            return self.default
        return self._static(rule)

    def _static(self, rule: RequestRule) -> Verifier:
        """The verifier of a rule built per request (a static weight, a relaxed rule, a judge's threshold), the
        ``max_cached`` most recently used kept."""
        verifier = self._verifiers.get(rule)
        if verifier is None:
            if rule.judge is not None:
                name, threshold = rule.judge
                verifier = JudgeVerifier(self.judges[name], threshold=threshold)
            elif rule.relaxed is not None:
                name, values = rule.relaxed
                verifier = _RELAXED_RULES[name][1](**dict(values))
            else:
                verifier = StaticEnsembleVerifier(rule.target_weight, mixing=rule.mixing)
            self._verifiers[rule] = verifier
            while len(self._verifiers) > self.max_cached:
                self._verifiers.popitem(last=False)
        self._verifiers.move_to_end(rule)
        return verifier

    def for_request(self, extra_args: Any) -> Verifier:
        """The verifier of a request with these ``SamplingParams.extra_args`` (checked: :func:`request_rule`)."""
        rule = request_rule(extra_args, self.settings)
        return self.default if rule is None else self.verifier(rule)


def request_rule(extra_args: Any, settings: DiversedVllmSettings | None) -> RequestRule | None:
    """A request's ``extra_args["diversed"]`` checked against its engine's settings (``None`` for an engine without
    DIVERSED); ``None`` when the request does not choose (it gets the engine's default rule)."""
    if not isinstance(extra_args, dict) or CONFIG_KEY not in extra_args:
        return None
    where = f'extra_args["{CONFIG_KEY}"]'
    values = extra_args[CONFIG_KEY]
    if settings is None:
        raise ValueError(
            f"{where} chooses a DIVERSED verification rule, but this engine verifies with vLLM's own rule: start it "
            f'with additional_config={{"{CONFIG_KEY}": {{...}}}} (and a draft model), or drop {where}.'
        )
    if not isinstance(values, dict):
        raise ValueError(
            f"{where} must be a JSON object, got {type(values).__name__} {values!r}. Example: {_REQUEST_EXAMPLE}."
        )
    unknown = sorted(set(values) - set(_REQUEST_KEYS))
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; the keys are {list(_REQUEST_KEYS)}.")
    if "judge" in values:
        return _judge_rule(where, values, settings)
    relaxed = [name for name in _RELAXED_RULES if name in values]
    if relaxed:
        return _relaxed_rule(where, values, relaxed)
    target_weight, head, mixing = values.get("target_weight"), values.get("head"), values.get("mixing", "probs")
    if (target_weight is None) == (head is None):
        raise ValueError(
            f"{where} must name exactly one of `target_weight` and `head`, got target_weight={target_weight!r}, "
            f"head={head!r}. Example: {_REQUEST_EXAMPLE}."
        )
    if target_weight is not None:
        _check_weight(where, target_weight)
    _check_mixing(where, mixing, target_weight)
    if head is not None:
        loaded = sorted(settings.head_sources)
        if not isinstance(head, str) or head not in loaded:
            raise ValueError(
                f'{where}["head"] must name a head this engine loaded ({loaded or "none"}: additional_config'
                f'["{CONFIG_KEY}"]["heads"] names them), got {head!r}.'
            )
        return RequestRule(head=head)
    return RequestRule(target_weight=float(target_weight), mixing=mixing)


def _relaxed_rule(where: str, values: dict, relaxed: list[str]) -> RequestRule:
    """A request naming a relaxed rule: that rule alone, its keys checked by the verifier itself."""
    others = sorted(set(values) - {relaxed[0]})
    if len(relaxed) > 1 or others:
        raise ValueError(f"{where} names {relaxed[0]!r} with {others + relaxed[1:]}: a request picks one rule.")
    name = relaxed[0]
    keys, build = _RELAXED_RULES[name]
    given = values[name]
    if not isinstance(given, dict) or sorted(set(given) - set(keys)):
        raise ValueError(f'{where}["{name}"] must be a JSON object with the keys {list(keys)}, got {given!r}.')
    settings = {**keys, **given}
    missing = [key for key, value in settings.items() if value is None]
    if missing:
        raise ValueError(f'{where}["{name}"] needs {missing}, got {given!r}.')
    try:
        build(**settings)  # refuses a bad knob, by name
    except (TypeError, ValueError) as error:
        raise ValueError(f'{where}["{name}"]: {error}') from None
    return RequestRule(relaxed=(name, tuple(sorted(settings.items()))))


def _judge_rule(where: str, values: dict, settings: DiversedVllmSettings) -> RequestRule:
    """A request naming a judge: ``"name"`` or ``{"name": name, "threshold": t}`` (0.5 when left out)."""
    others = sorted(set(values) - {"judge"})
    if others:
        raise ValueError(f"{where} names 'judge' with {others}: a request picks one rule.")
    given = values["judge"]
    entry = {"name": given} if isinstance(given, str) else given
    if not isinstance(entry, dict) or sorted(set(entry) - {"name", "threshold"}) or "name" not in entry:
        raise ValueError(
            f'{where}["judge"] must be a loaded judge\'s name or {{"name": name, "threshold": t}}, got {given!r}.'
        )
    loaded = sorted(settings.judge_sources)
    if entry["name"] not in loaded:
        raise ValueError(
            f'{where}["judge"] must name a judge this engine loaded ({loaded or "none"}: additional_config'
            f'["{CONFIG_KEY}"]["judges"] names them), got {entry["name"]!r}.'
        )
    threshold = entry.get("threshold", 0.5)
    if isinstance(threshold, bool) or not is_real(threshold) or not threshold >= 0:
        raise ValueError(
            f'{where}["judge"]["threshold"] must be a non-negative number (above 1 the judge never fires: lossless '
            f"SD; 0 keeps every draft), got {threshold!r}."
        )
    return RequestRule(judge=(entry["name"], float(threshold)))


def _head_identity(head: DiversedHead, source: str) -> str:
    """What identifies a loaded head: its architecture, features, recorded pair and the digest of its weights."""
    config = head.config
    local = Path(source).expanduser()
    where = "local directory" if local.is_dir() else "Hub repo"
    reads = "hidden states and " if config.use_hidden_states else ""
    return (
        f"{where}; architecture={config.architecture!r}, mixing={config.mixing!r}, reads {reads}"
        f"features={config.features}, task={config.task!r}, pair=({config.target_model_id!r}, "
        f"{config.draft_model_id!r}), weights sha256={weights_digest(head)[:16]}"
    )


def settings_from_additional_config(additional_config: Any) -> DiversedVllmSettings | None:
    """The engine's DIVERSED settings, or ``None`` when ``additional_config`` has no ``"diversed"`` entry."""
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    values = additional_config[CONFIG_KEY]
    if not isinstance(values, dict):
        raise ValueError(
            f'additional_config["{CONFIG_KEY}"] must be a JSON object, got {type(values).__name__} {values!r}. '
            f"Example: {_EXAMPLE}."
        )
    unknown = sorted(set(values) - set(_KEYS))
    if unknown:
        raise ValueError(f'additional_config["{CONFIG_KEY}"] has unknown keys {unknown}; the keys are {list(_KEYS)}.')
    return DiversedVllmSettings(**values)
