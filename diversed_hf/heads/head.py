"""The DIVERSED ensemble head: ``w_t = f_theta(h^q_t, h^p_t, f_t)`` (docs/method.md §4).

A small network reads the last-layer hidden state of the draft and of the target at the
position that produced ``q_t`` / ``p_t`` and outputs the weight ``w_t`` in (0, 1) that the
verification mixture puts on the **target**. Both models stay frozen; only the head trains.
It may also read ``f_t``, named statistics of ``p_t`` and ``q_t`` (``config.features``, computed by
:func:`diversed_hf.verifiers.distribution_features.distribution_features`), or those alone
(``use_hidden_states=False``: a
head that fits any pair sharing the target's tokenizer). It never reads the drafted token ``x_t``.

- ``linear``: ``w = sigmoid(W [h^q; h^p; f] + b)`` (the official release: one linear layer with a
  2-way softmax, which is a sigmoid of the difference of its two logits).
- ``mlp``: ``w = sigmoid(W_2 gelu(W_1 [LayerNorm([h^q; h^p]); f]) + b_2)`` (the features, already
  in [0, 1], skip the LayerNorm).

The output layer starts at zero weight and bias ``logit(w_0)``, so a freshly built head outputs
exactly ``w_0`` everywhere and behaves as the static ensemble with that weight.

A head is shared like an adapter, through ``huggingface_hub.ModelHubMixin``::

    head.save_pretrained("head-gsm8k")                  # config.json, model.safetensors, README.md
    head = DiversedHead.from_pretrained("org/head-gsm8k")   # a local directory or a Hub repo id
    head.push_to_hub("org/head-gsm8k")

The mixin does the work: it writes the config dataclass (``head.config``) as ``config.json`` and parses it
back once per load. The head fills its hooks: ``_save_pretrained`` (the weights), ``_from_pretrained`` (the
config checked as a whole, strict loading, dtype and device) and ``generate_model_card`` (the card, rendered
by :mod:`diversed_hf.heads.cards`). It overrides the three public methods only where the mixin has no hook, each
saying why in a comment (docs/architecture.md lists them): ``save_pretrained`` stages the save and moves it into
place file by file, the weights last, so an interrupted save never loads as a mix of two heads (the config's digest
no longer matches the old weights: an error at load), ``from_pretrained`` checks the name and offline mode before
the mixin fetches config.json, and ``push_to_hub`` checks the token before the mixin creates the repo. Loading is
strict (missing or unexpected weights are an error) and nothing is printed. Checkpoints of the official DIVERSED
code import with :meth:`DiversedHead.from_official_checkpoint`.

Imports point one way: :mod:`~diversed_hf.heads.hub` (files) and :mod:`~diversed_hf.heads.config` (the config) <- this
module. Card rendering (:mod:`diversed_hf.heads.cards`, which reads the task registry) is imported when a head is saved
or its card made, never by ``import diversed_hf``.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelHubMixin
from torch import nn

from .. import compat
from ..common.pairs import hidden_size_of, model_id_of
from . import hub, official
from .config import (  # noqa: F401  (re-exported: diversed_hf.heads.head has always named them)
    ARCHITECTURES,
    MAX_SIZE,
    MLP_HIDDEN_SIZE,
    DiversedHeadConfig,
    build_net,
    config_from_file,
)

logger = logging.getLogger(__name__)

#: keyword arguments ``from_pretrained`` takes besides huggingface_hub's download arguments
LOAD_OPTIONS = ("strict", "device", "dtype")


def _check_own_config(head: "DiversedHead", config: Any, method: str) -> None:
    """Refuse ``config``, ``ModelHubMixin``'s argument to write another config.json than the head's own."""
    if config is not None and config != head.config and config != asdict(head.config):
        raise TypeError(
            f"{method} got `config={config!r}`, but a head always saves its own config (`head.config`, "
            f"{head.extra_repr()}): a config.json describing another head would not load. Build a head with that "
            "config (`DiversedHead(config)`) and save it instead."
        )


class DiversedHead(
    nn.Module,
    ModelHubMixin,
    library_name=hub.LIBRARY_NAME,
    tags=list(hub.HUB_TAGS),
    paper_url=hub.PAPER_URL,
):
    """Ensemble head: ``head(draft_hidden, target_hidden, features) -> w``, the weight on the target.

    Example::

        head = DiversedHead.for_pair(target, draft, architecture="linear", w_0=0.5)
        target.generate(input_ids, assistant_model=draft, diversed_head=head, do_sample=True)
        # statistics of p_t and q_t only: no hidden states, usable with any pair sharing the tokenizer
        head = DiversedHead.for_pair(target, draft, features=["tv", "draft_top1"], use_hidden_states=False)

    Save, load and share it with :meth:`save_pretrained`, :meth:`from_pretrained` and
    :meth:`push_to_hub`: ``huggingface_hub.ModelHubMixin``'s, loading strictly.
    """

    def __init__(self, config: DiversedHeadConfig | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = DiversedHeadConfig(**kwargs)
        elif kwargs:
            raise TypeError(f"Pass either a `config` or keyword arguments, not both (got {sorted(kwargs)}).")
        if not isinstance(config, DiversedHeadConfig):
            raise TypeError(f"`config` must be a DiversedHeadConfig, got {type(config).__name__}.")
        compat.set_hub_mixin_config(self, config)  # what ModelHubMixin writes as config.json (`dataclasses.asdict`)
        self.net = build_net(config)
        self.reset_output_layer()

    @property
    def config(self) -> DiversedHeadConfig:
        """The head's configuration: the dataclass ``ModelHubMixin`` saves as ``config.json``."""
        return compat.hub_mixin_config(self)

    def reset_output_layer(self) -> None:
        """Zero the output layer and set its bias to ``logit(w_0)``: the head then outputs ``w_0`` everywhere."""
        output_layer = self.net[-1]
        with torch.no_grad():
            output_layer.weight.zero_()
            output_layer.bias.fill_(math.log(self.config.w_0 / (1.0 - self.config.w_0)))

    @classmethod
    def for_pair(
        cls,
        target,
        draft,
        architecture: str = "linear",
        w_0: float = 0.5,
        mixing: str = "probs",
        features: list[str] | tuple[str, ...] = (),
        use_hidden_states: bool = True,
        **kwargs,
    ):
        """A fresh head sized for a loaded ``target`` and ``draft``, recording their model ids (and hidden sizes,
        which a head with ``use_hidden_states=False`` records but never checks)."""
        config = DiversedHeadConfig(
            draft_hidden_size=hidden_size_of(draft),
            target_hidden_size=hidden_size_of(target),
            architecture=architecture,
            w_0=w_0,
            mixing=mixing,
            features=features,
            use_hidden_states=use_hidden_states,
            target_model_id=model_id_of(target),
            draft_model_id=model_id_of(draft),
            **kwargs,
        )
        return cls(config)

    def logit(
        self,
        draft_hidden: torch.Tensor | None,  # (batch, tokens, d_draft); ignored without use_hidden_states
        target_hidden: torch.Tensor | None,  # (batch, tokens, d_target); ignored without use_hidden_states
        features: torch.Tensor | None = None,  # (batch, tokens, F) distribution_features(q, p, config.features)
    ) -> torch.Tensor:  # (batch, tokens)
        """Pre-sigmoid score; ``w = sigmoid(logit)``."""
        config, parts = self.config, []
        if config.use_hidden_states:
            if draft_hidden is None or target_hidden is None:
                raise ValueError("This head reads hidden states: pass `draft_hidden` and `target_hidden`.")
            if (
                draft_hidden.shape[-1] != config.draft_hidden_size
                or target_hidden.shape[-1] != config.target_hidden_size
            ):
                raise ValueError(
                    f"This head expects hidden sizes (draft {config.draft_hidden_size}, target "
                    f"{config.target_hidden_size}), got (draft {draft_hidden.shape[-1]}, target "
                    f"{target_hidden.shape[-1]})."
                )
            parts += [draft_hidden, target_hidden]
        num_features = 0 if features is None else features.shape[-1]
        if num_features != len(config.features):
            raise ValueError(
                f"This head reads the features {config.features}: `features` must be (batch, tokens, "
                f"{len(config.features)}), got {None if features is None else tuple(features.shape)}. Compute them "
                "with `diversed_hf.verifiers.distribution_features.distribution_features(draft_probs, target_probs, "
                "head.config.features)`."
            )
        if num_features:
            parts.append(features.to(self.net[-1].weight.dtype))
        if any(part.shape[:-1] != parts[0].shape[:-1] for part in parts):
            raise ValueError(
                f"The head's inputs {[tuple(part.shape) for part in parts]} (draft hidden, target hidden, features) "
                "must agree on every dimension but the last: (batch, tokens, size)."
            )
        inputs = torch.cat(parts, dim=-1)  # (batch, tokens, d_draft + d_target + F)
        return self.net(inputs).squeeze(-1)  # (batch, tokens)

    def forward(
        self,
        draft_hidden: torch.Tensor | None,  # (batch, tokens, d_draft)
        target_hidden: torch.Tensor | None,  # (batch, tokens, d_target)
        features: torch.Tensor | None = None,  # (batch, tokens, F)
    ) -> torch.Tensor:  # (batch, tokens)
        logit = self.logit(draft_hidden, target_hidden, features)  # (batch, tokens)
        # The sigmoid runs in float64 so that a fresh head returns w_0 rounded once, exactly as a
        # static weight would be.
        return torch.sigmoid(logit.double()).to(logit.dtype)

    def extra_repr(self) -> str:
        config = self.config
        reads = f", features={config.features}" if config.features else ""
        reads += "" if config.use_hidden_states else ", no hidden states"
        return f"architecture={config.architecture!r}, w_0={config.w_0}, mixing={config.mixing!r}{reads}"

    # Hub: save / load / push -----------------------------------------------------------------------
    #
    # huggingface_hub.ModelHubMixin does the work: it writes `config` (the dataclass, kept by the mixin; compat) to
    # config.json and reads it back; `_save_pretrained` / `_from_pretrained` write and read the weights and
    # `generate_model_card` renders the card. The public methods are overridden only for what the mixin has no hook
    # for, each saying what; every override checks or adds its arguments and calls the mixin's method.

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        *,
        results: Any = None,
        training_config: Any = None,
        config: Any = None,
        repo_id: str | None = None,
        push_to_hub: bool = False,
        model_card_kwargs: dict[str, Any] | None = None,
        **push_to_hub_kwargs,
    ) -> str | None:
        """Write the head to ``save_directory``: ``config.json``, ``model.safetensors`` and a ``README.md`` card.

        Args:
            results: benchmark metrics for the card: a path to a results file or its content (a list
                of rows, or ``{"setting": ..., "rows": [...]}``; format in :mod:`diversed_hf.heads.cards`).
                Written as ``results.json``. Without it, a ``results.json`` already in the directory is kept
                when the directory holds this very head (same config and weights), and removed otherwise.
            training_config: how the head was trained (a dict, a dataclass such as the trainer's config, or a
                path to a JSON file); written as ``training_config.json``, shown on the card; kept as ``results``.
            config: the mixin's argument; the head always writes its own ``head.config`` (any other is refused).
            repo_id: the Hub repo the card's usage snippet names (default: the local directory).
            push_to_hub: also upload the directory to ``repo_id`` (default: the directory's name);
                ``push_to_hub_kwargs`` go to :meth:`push_to_hub`.
            model_card_kwargs: the mixin's route for card inputs; ``results`` / ``training_config`` may come
                this way too (it is how :meth:`push_to_hub` passes them).

        Returns:
            The commit URL when pushing, else ``None``.
        """
        # Override: ModelHubMixin.save_pretrained deletes config.json from `save_directory` and then writes into it,
        # with no hook before, so a failed save would leave neither head; it also keeps a README.md already there and
        # hands `_save_pretrained` only the directory. So the mixin saves into a staging directory, with the result
        # files written there first, and the staging directory moves into place once complete.
        _check_own_config(self, config, "save_pretrained")
        if push_to_hub_kwargs and not push_to_hub:
            raise TypeError(
                f"save_pretrained got unexpected arguments {sorted(push_to_hub_kwargs)}; it takes results, "
                "training_config, repo_id, push_to_hub and model_card_kwargs (arguments of push_to_hub only with "
                "push_to_hub=True)."
            )
        card_kwargs = dict(model_card_kwargs or {})
        results = card_kwargs.pop("results", None) if results is None else results
        training_config = card_kwargs.pop("training_config", None) if training_config is None else training_config
        directory = Path(save_directory)
        hub.check_finite(
            self.state_dict(),
            "The head's weights",
            f"it is not saved to {directory}. A trained head goes "
            "NaN when training diverged: lower the learning rate and check the rewards, then re-train.",
        )
        repo_id = repo_id or card_kwargs.pop("repo_id", None) or (directory.name if push_to_hub else None)
        same_head = hub.holds_head(directory, asdict(self.config), self.state_dict())  # its results.json stays valid
        # A killed save's staging directory is removed by the next save (hub.new_staging_dir).
        staging = hub.new_staging_dir(directory)
        from . import cards  # card rendering (the lab's task registry, jinja2) loads when a head is saved

        try:
            card_inputs, stale = cards.stage_result_files(staging, directory, results, training_config, same_head)
            card_kwargs.update(card_inputs, repo_id=repo_id, head_source=str(directory))
            super().save_pretrained(staging, model_card_kwargs=card_kwargs)
            hub.move_into_place(staging, directory, remove=stale)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if stale:
            logger.warning(
                "removed %s from %s: it described the head saved there before, not this one", stale, directory
            )
        logger.info("saved DiversedHead to %s", directory)
        if push_to_hub:
            return self.push_to_hub(repo_id, model_card_kwargs=card_kwargs, **push_to_hub_kwargs)
        return None

    def _save_pretrained(self, save_directory: Path) -> None:
        """``model.safetensors``, recording the digest of the config the mixin writes beside it (the mixin hook)."""
        digest = hub.config_digest(asdict(self.config))
        hub.save_weights(self.state_dict(), Path(save_directory) / hub.WEIGHTS_NAME, config_sha256=digest)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        force_download: bool = False,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        revision: str | None = None,
        **load_options,
    ) -> "DiversedHead":
        """Load a head from a local directory or a Hub repo id (``"org/head-gsm8k"``), in eval mode.

        Args:
            pretrained_model_name_or_path: a directory written by :meth:`save_pretrained`, or a repo id.
            revision, cache_dir, token, force_download, local_files_only: as in
                ``huggingface_hub.hf_hub_download`` (``revision`` only for a repo id). With ``HF_HUB_OFFLINE=1`` (even
                when set after ``huggingface_hub`` was imported) the files come from the cache only, without a
                network attempt.
            strict: missing or unexpected weights are an error (default). With ``strict=False`` they are
                logged as a warning; shape mismatches are always an error.
            device: where to put the head (default CPU).
            dtype: dtype of the parameters (default: the dtype the weights were saved in).

        Check it against the models it will run with: ``generate`` errors on other hidden sizes (if it reads them) and
        warns when the models' ids differ from ``config.target_model_id`` / ``config.draft_model_id``.
        """
        # Override: ModelHubMixin.from_pretrained fetches and parses config.json before it calls `_from_pretrained`,
        # with no hook before, and reads HF_HUB_OFFLINE only when huggingface_hub is imported. So the name is checked
        # here (no file is read), offline mode is passed on as `local_files_only`, and that fetch's failures get
        # errors that say what to do. config.json is then fetched and parsed once, by the mixin.
        source, _ = hub.check_source(
            pretrained_model_name_or_path,
            revision=revision,
            force_download=force_download,
            local_files_only=local_files_only,
        )
        offline = local_files_only or hub.is_offline()
        with hub.config_fetch_errors(source, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only):
            return super().from_pretrained(
                source,
                force_download=force_download,
                token=token,
                cache_dir=cache_dir,
                local_files_only=offline,
                revision=revision,
                **load_options,
            )

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | os.PathLike | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        config: dict | None = None,
        strict: bool = True,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        **config_fields: Any,
    ) -> "DiversedHead":
        """The head ``config`` (config.json, parsed by the mixin) describes, with ``model.safetensors`` loaded strictly
        (the ``ModelHubMixin`` hook).

        ``config_fields`` are config.json's fields again: the mixin passes them as keyword arguments because
        ``__init__`` takes ``**kwargs``. Any other keyword argument, or another value for one of them, is refused.
        """
        locate = dict(
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            force_download=force_download,
            local_files_only=local_files_only,
        )
        where = f"{model_id}/{hub.CONFIG_NAME}" + (f" (revision {revision})" if revision else "")
        if config is None:  # the mixin could not fetch config.json (it logs and goes on): fetched here for the error
            config = hub.read_json(hub.resolve_file(model_id, hub.CONFIG_NAME, **locate), "Head config")
        values, config = config, config_from_file(config, where)
        unexpected = sorted(
            name for name, value in config_fields.items() if name not in values or values[name] != value
        )
        if unexpected:
            raise TypeError(
                f"DiversedHead.from_pretrained got unexpected arguments {unexpected}; it takes {list(LOAD_OPTIONS)} "
                "besides the download arguments. The architecture comes from the saved config.json: to change it, "
                "build a new head with `DiversedHead.for_pair`."
            )
        weights_path = hub.resolve_file(model_id, hub.WEIGHTS_NAME, **locate)
        with torch.device("meta"):  # the head config.json describes, checked against the file before it is allocated
            shapes = {name: tuple(tensor.shape) for name, tensor in cls(config).state_dict().items()}
        hub.check_weight_shapes(shapes, hub.weight_shapes(weights_path), str(weights_path), f"{config.architecture!r}")
        state_dict = hub.load_weights(weights_path)
        hub.check_finite(
            state_dict,
            f"The weights in {weights_path}",
            "the head would verify against garbage. Re-download it with `force_download=True` or re-train it.",
        )
        hub.check_same_save(values, where, weights_path)
        head = cls._built_without_rng(config)
        stored_dtypes = {tensor.dtype for tensor in state_dict.values() if tensor.is_floating_point()}
        head.to(dtype=dtype or (stored_dtypes.pop() if len(stored_dtypes) == 1 else None))
        missing, unexpected = head.load_state_dict(state_dict, strict=False)
        if missing or unexpected:
            message = (
                f"The weights in {weights_path} do not match a {config.architecture!r} head: missing "
                f"{sorted(missing)}, unexpected {sorted(unexpected)}."
            )
            if strict:
                raise ValueError(message + " Re-save the head, or pass strict=False to load what matches.")
            logger.warning("%s Loading the rest (strict=False).", message)
        logger.info("loaded DiversedHead from %s (%s)", model_id, head.extra_repr())
        return head.to(device).eval()

    @classmethod
    def _built_without_rng(cls, config: DiversedHeadConfig) -> "DiversedHead":
        """``cls(config)`` leaving the global CPU RNG as it was: loading must not shift a run's random stream."""
        with torch.random.fork_rng(devices=[]):
            return cls(config)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        results: Any = None,
        training_config: Any = None,
        config: Any = None,
        token: str | None = None,
        commit_message: str = hub.DEFAULT_COMMIT_MESSAGE,
        model_card_kwargs: dict[str, Any] | None = None,
        **push_kwargs,
    ) -> str:
        """Save the head (with its card) and upload it to the Hub repo ``repo_id``; returns the commit URL.

        Needs a write token (``token``, ``HF_TOKEN`` or ``hf auth login``): without one, or offline, it
        fails before any network call. ``results`` / ``training_config`` / ``config`` as in :meth:`save_pretrained`;
        ``private``, ``branch``, ``create_pr`` and the pattern arguments as in ``ModelHubMixin.push_to_hub``.
        To push a saved directory as it is (with its ``results.json``), use ``diversed-hf push DIR``.
        """
        # Override: ModelHubMixin.push_to_hub creates the repo before anything else, with no hook before, so what needs
        # no network (repo id, token, offline mode) is checked here, and connection and permission failures get errors
        # that say what to do. The card inputs travel to save_pretrained as `model_card_kwargs`, the mixin's route.
        _check_own_config(self, config, "push_to_hub")
        token = hub.check_push(repo_id, token)
        card_kwargs = {**(model_card_kwargs or {}), "repo_id": repo_id}
        card_kwargs.update(
            (name, value)
            for name, value in (("results", results), ("training_config", training_config))
            if value is not None
        )
        with hub.push_errors(repo_id):
            commit = super().push_to_hub(
                repo_id, token=token, commit_message=commit_message, model_card_kwargs=card_kwargs, **push_kwargs
            )
        logger.info("pushed DiversedHead to %s", commit)
        return str(commit)

    def generate_model_card(
        self,
        repo_id: str | None = None,
        results: Any = None,
        training_config: Any = None,
        head_source: str | None = None,
        **unused: Any,
    ) -> ModelCard:
        """The ``huggingface_hub.ModelCard`` of this head (the ``ModelHubMixin`` hook; template
        ``diversed_hf/templates/model_card.md``, rendered by :func:`diversed_hf.heads.cards.render_card`)."""
        if unused:
            raise TypeError(
                f"generate_model_card got unexpected arguments {sorted(unused)}; it takes repo_id, results, "
                "training_config and head_source."
            )
        from . import cards  # card rendering (the lab's task registry, jinja2) loads when a card is made

        return cards.render_card(
            self.config,
            repo_id=repo_id,
            results=results,
            training_config=training_config,
            head_source=head_source,
            num_parameters=sum(parameter.numel() for parameter in self.parameters()),
        )

    # Official DIVERSED checkpoints --------------------------------------------------------------------

    @classmethod
    def from_official_checkpoint(
        cls,
        path: str | os.PathLike,
        *,
        target_model_id: str | None = None,
        draft_model_id: str | None = None,
        task: str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> "DiversedHead":
        """Import a head saved by the official DIVERSED code (docs/method.md §4) as an equivalent
        ``mixing="logits"`` head.

        The official head is ``softmax(summary([h^q; h^p]))`` with ``summary`` a ``Linear(d_q + d_p, 2)``
        whose output 0 weighs the draft and output 1 the target, mixing logits. A 2-way softmax is a
        sigmoid of the difference of its logits, so

            w = softmax(z)[1] = sigmoid(z_1 - z_0) = sigmoid((W_1 - W_0) [h^q; h^p] + (b_1 - b_0))

        is a ``linear`` head with weight ``W_1 - W_0`` and bias ``b_1 - b_0``. ``w_0`` is recorded as
        0.5 (the official initialisation). ``path`` is the directory holding ``ensemble_head.bin`` and
        ``ensemble_config.json``; the model ids default to the paths recorded there.
        """
        directory, sizes, recorded_ids, weight, bias = official.read_official_checkpoint(path)
        config = DiversedHeadConfig(
            draft_hidden_size=sizes["draft_hidden_size"],
            target_hidden_size=sizes["target_hidden_size"],
            architecture="linear",
            w_0=0.5,
            mixing="logits",
            target_model_id=target_model_id or recorded_ids["target"],
            draft_model_id=draft_model_id or recorded_ids["draft"],
            task=task,
        )
        head = cls._built_without_rng(config)
        weight, bias = weight.double(), bias.double()  # exact differences of the stored values
        with torch.no_grad():
            head.net[0].weight.copy_((weight[1] - weight[0]).unsqueeze(0))  # (1, d_q + d_p)
            head.net[0].bias.copy_((bias[1] - bias[0]).reshape(1))  # (1,)
        logger.info("imported official DIVERSED head from %s", directory)
        return head.to(dtype=dtype).eval()
