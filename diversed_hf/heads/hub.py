"""Hugging Face Hub plumbing for heads: find a head's files (local folder or Hub repo), read them, push them.

A head repo holds

=========================== ============================================================
``config.json``             :class:`~diversed_hf.heads.head.DiversedHeadConfig` as JSON
``model.safetensors``       the head's weights
``README.md``               the model card (:mod:`diversed_hf.heads.cards`)
``results.json``            optional: benchmark metrics for the card (format in :mod:`diversed_hf.heads.cards`)
``training_config.json``    optional: how the head was trained, shown on the card
=========================== ============================================================

Files come from a local directory as they are, or through ``huggingface_hub.hf_hub_download``
(so ``revision``, ``cache_dir``, ``token``, ``force_download`` and ``local_files_only`` mean what
they mean there). Offline mode (``HF_HUB_OFFLINE=1``) is honoured even when it is set after
``huggingface_hub`` was imported: files then come from the cache only, without a network attempt.

Every failure is turned into an error that says what is missing and how to fix it. This module is the
bottom of the head's import chain (``hub`` <- ``cards`` <- ``head``): it imports nothing else of diversed_hf.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

import huggingface_hub
import torch
from huggingface_hub import constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
RESULTS_NAME = "results.json"
TRAINING_CONFIG_NAME = "training_config.json"
CONFIG_DIGEST_KEY = "diversed_config_sha256"  # safetensors metadata: sha256 of the config.json saved alongside
#: the files a head repo may hold; ``push`` uploads these and nothing else
REPO_FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, RESULTS_NAME, TRAINING_CONFIG_NAME)

#: version of the ``config.json`` format this release writes (it reads every version up to it). 2 added
#: ``features`` and ``use_hidden_states``; a format-1 file lacks them and loads as the hidden-state-only head it was.
HEAD_FORMAT_VERSION = 2
#: fields a saved ``config.json`` must carry (``mlp_hidden_size`` too for the ``mlp`` architecture)
REQUIRED_FILE_FIELDS = ("format_version", "architecture", "mixing", "draft_hidden_size", "target_hidden_size")

DEFAULT_COMMIT_MESSAGE = "Upload DIVERSED head with diversed_hf"
PAPER_URL = "https://arxiv.org/abs/2604.07622"
LIBRARY_NAME = "diversed_hf"
#: tags of every head on the Hub (the card adds the head's task, and the tag huggingface_hub's mixin adds)
HUB_TAGS = ("diversed", "speculative-decoding", "ensemble-head")

_TRUE = {"1", "on", "yes", "true"}


def is_offline() -> bool:
    """True when Hub access is disabled: ``huggingface_hub``'s offline constant or the env var, read now."""
    if constants.is_offline_mode():
        return True
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def _network_error_types() -> tuple[type[BaseException], ...]:
    """Connection-level failures of the HTTP client huggingface_hub uses (httpx2 in 2.x, httpx in 1.x)."""
    types: list[type[BaseException]] = [OfflineModeIsEnabled, ConnectionError, TimeoutError]
    for module_name in ("httpx2", "httpx"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        types.append(module.TransportError)
    return tuple(types)


def check_source(
    name_or_path: str | os.PathLike,
    filename: str = CONFIG_NAME,
    *,
    revision: str | None = None,
    force_download: bool = False,
    local_files_only: bool = False,
) -> tuple[str, bool]:
    """``(source, is_local)``: where a head's ``filename`` comes from, checked without reading any file.

    A local directory (``~`` expanded) must hold ``filename`` and takes no ``revision``; anything else must be a
    valid Hub repo id, and ``force_download`` needs the network. Raises ``FileNotFoundError`` / ``ValueError``.
    """
    source = str(name_or_path)
    local = Path(source).expanduser()
    if local.is_dir():
        if revision is not None:
            raise ValueError(
                f"`revision={revision!r}` picks a version of a Hub repo, but {source!r} is a local directory: check "
                "that version out there, or pass the repo id."
            )
        if not (local / filename).is_file():
            raise FileNotFoundError(
                f"`{filename}` not found in the head directory {local.resolve()}. {_save_hint(filename)}"
            )
        return str(local), True
    if local.exists():
        raise ValueError(
            f"{source!r} is a file; pass the head's directory (the folder holding {CONFIG_NAME} and {WEIGHTS_NAME})."
        )
    try:
        huggingface_hub.utils.validate_repo_id(source)
    except HFValidationError as error:
        raise ValueError(
            f"{source!r} is neither an existing directory nor a valid Hub repo id ('org/name'): {error}"
        ) from error
    if force_download and (local_files_only or is_offline()):
        raise ValueError(
            "`force_download=True` needs network access, but offline mode is on (HF_HUB_OFFLINE=1 or "
            "local_files_only=True)."
        )
    return source, False


def resolve_file(
    name_or_path: str | os.PathLike,
    filename: str,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    force_download: bool = False,
    local_files_only: bool = False,
) -> Path:
    """Path of ``filename`` in a local head directory or a Hub repo (downloaded or from the cache).

    Raises ``FileNotFoundError`` when the file is missing (or not cached while offline), ``ValueError``
    for a name that is neither a directory nor a repo id, ``ConnectionError`` when the Hub is unreachable.
    """
    source, local = check_source(
        name_or_path, filename, revision=revision, force_download=force_download, local_files_only=local_files_only
    )
    if local:
        return Path(source) / filename
    offline = local_files_only or is_offline()
    with download_errors(source, filename, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only):
        return Path(
            huggingface_hub.hf_hub_download(
                repo_id=source,
                filename=filename,
                revision=revision,
                cache_dir=cache_dir,
                token=token,
                force_download=force_download,
                local_files_only=offline,
            )
        )


@contextlib.contextmanager
def download_errors(
    source: str, filename: str, *, revision: str | None, cache_dir: str | os.PathLike | None, local_files_only: bool
) -> Iterator[None]:
    """Turn huggingface_hub's failures to fetch ``filename`` of the head repo ``source`` into errors that say what to do
    (``local_files_only``: as the caller passed it; offline mode is read here)."""
    where = f"{source!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        yield
    except LocalEntryNotFoundError as error:
        cache = Path(cache_dir or constants.HF_HUB_CACHE)
        if local_files_only or is_offline():
            if is_offline():
                reason = "offline mode is on (HF_HUB_OFFLINE=1" + (
                    "; `local_files_only=True`)" if local_files_only else ")"
                )
            else:
                reason = "`local_files_only=True` was passed"
            raise FileNotFoundError(
                f"`{filename}` of head {where} is not in the Hugging Face cache ({cache}) and {reason}. Download it "
                f"once with network access (`hf download {source}`), point `cache_dir` at the cache that has it, "
                "or pass a local directory."
            ) from error
        raise FileNotFoundError(
            f"Could not download `{filename}` of head {where} (the Hub is unreachable) and it is not in the Hugging "
            f"Face cache ({cache}). Check your network, or pass a local directory (with HF_HUB_OFFLINE=1 cached heads "
            "load without any network attempt)."
        ) from error
    except (GatedRepoError, RepositoryNotFoundError) as error:
        raise FileNotFoundError(
            f"Head repo {where} was not found on the Hub, or it is private/gated and your token has no access. "
            "Check the repo id, or log in with `hf auth login` / pass `token=`."
        ) from error
    except RevisionNotFoundError as error:
        raise FileNotFoundError(f"Revision {revision!r} not found in head repo {source!r}.") from error
    except EntryNotFoundError as error:
        raise FileNotFoundError(f"Head repo {where} has no `{filename}`. {_save_hint(filename)}") from error
    except HfHubHTTPError as error:
        raise OSError(f"The Hub refused to serve `{filename}` of head {where}: {error}") from error
    except _network_error_types() as error:
        raise ConnectionError(
            f"Could not reach the Hub to download `{filename}` of head {where}: {error}. Check your network, or "
            "set HF_HUB_OFFLINE=1 to load from the cache."
        ) from error


def _save_hint(filename: str) -> str:
    if filename == WEIGHTS_NAME:
        return "Save the head with `head.save_pretrained(dir)`, which writes config.json and model.safetensors."
    if filename == CONFIG_NAME:
        return "This does not look like a saved DiversedHead; save one with `head.save_pretrained(dir)`."
    return ""


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file, naming the file in the error."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{what} {path} is not valid JSON ({error}); re-save the head or fix the file.") from error


def check_format_version(version) -> None:
    """Raise a ValueError unless ``version`` is a ``config.json`` format version this release reads."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`format_version` must be a positive integer, got {version!r}.")
    if version > HEAD_FORMAT_VERSION:
        raise ValueError(
            f"`format_version` {version} is newer than this diversed_hf supports ({HEAD_FORMAT_VERSION}): the head was "
            "saved by a newer release. Upgrade diversed_hf: pip install -U diversed_hf."
        )


def check_head_config(values: Any, where: str) -> dict:
    """``values``, the parsed ``config.json`` at ``where``, checked as a file: a JSON object, a head's (not a model's)
    config, a format version this release reads, every field of :data:`REQUIRED_FILE_FIELDS` present.

    The values themselves are checked by ``DiversedHeadConfig``; this is what reading the file needs.
    """
    if not isinstance(values, dict):
        raise ValueError(f"Head config {where} must hold a JSON object, got {type(values).__name__}.")
    if "draft_hidden_size" not in values and ("model_type" in values or "architectures" in values):
        raise ValueError(
            f"{where} is a transformers model config (model_type={values.get('model_type')!r}), not a DiversedHead "
            "config: pass the directory (or repo) of a head saved with `head.save_pretrained`, not a model's."
        )
    try:
        check_format_version(values.get("format_version", HEAD_FORMAT_VERSION))
    except ValueError as error:
        raise ValueError(f"Head config {where}: {error}") from error
    required = REQUIRED_FILE_FIELDS + (("mlp_hidden_size",) if values.get("architecture") == "mlp" else ())
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(
            f"Head config {where} is missing the fields {missing}; it was not written by "
            "`DiversedHead.save_pretrained` or was edited. Re-save the head."
        )
    return values


def read_head_config(path: str | os.PathLike) -> dict:
    """The JSON object of the head ``config.json`` at ``path``, checked by :func:`check_head_config`."""
    return check_head_config(read_json(Path(path), "Head config"), str(path))


@contextlib.contextmanager
def config_fetch_errors(
    source: str, *, revision: str | None, cache_dir: str | os.PathLike | None, local_files_only: bool
) -> Iterator[None]:
    """Clear errors for the failures of ``ModelHubMixin.from_pretrained``'s own fetch of ``config.json``: not in the
    cache (offline, or the Hub unreachable), or not JSON. Only types that ``_from_pretrained`` never lets out are
    caught, so its own errors pass unchanged."""
    try:
        yield
    except LocalEntryNotFoundError as error:
        with download_errors(
            source, CONFIG_NAME, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only
        ):
            raise error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"Head config {source}/{CONFIG_NAME} is not valid JSON ({error}); re-save the head or fix the file."
        ) from error


def write_json(path: Path, value: Any) -> None:
    """Write JSON with sorted keys; values JSON cannot hold (paths, enums) are written as strings."""
    Path(path).write_text(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``model.safetensors`` file on the CPU; a clear error for a damaged file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}): it is truncated or corrupted. Re-save the head "
            "with `head.save_pretrained(dir)`, or re-download it with `force_download=True`."
        ) from error


def weights_digest(module) -> str:
    """sha256 (hex) of a module's weights: every ``state_dict`` entry by name, as float32 bytes. Two heads with the
    same digest compute the same ``w_t`` (what ``calibrate_head.py --reuse`` and the vLLM plugin key heads by)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def config_digest(values: dict) -> str:
    """sha256 (hex) of a head config's canonical JSON text, ``json.dumps(values, indent=2, sort_keys=True) + "\\n"``.

    It depends on the values only, not on how config.json is formatted (``ModelHubMixin`` writes it without the
    final newline; the shipped heads' files hold exactly this text, and their recorded digests match either way).
    """
    return hashlib.sha256((json.dumps(values, indent=2, sort_keys=True) + "\n").encode("utf-8")).hexdigest()


def save_weights(state_dict: dict[str, torch.Tensor], path: Path, *, config_sha256: str | None = None) -> None:
    """Write ``model.safetensors``; ``config_sha256`` (the :func:`config_digest` of the config saved with it) goes in
    its metadata, so that a directory mixing the files of two saves is detected at load (:func:`check_same_save`)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in state_dict.items()}
    metadata = {"format": "pt"} if config_sha256 is None else {"format": "pt", CONFIG_DIGEST_KEY: config_sha256}
    save_file(tensors, str(path), metadata=metadata)


def check_same_save(config: dict, where: str, weights_path: Path) -> None:
    """Raise if ``model.safetensors`` records the digest of another config than ``config`` (read from ``where``).

    Weights saved without a digest carry none and are not checked.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(weights_path), framework="pt") as weights:
            recorded = (weights.metadata() or {}).get(CONFIG_DIGEST_KEY)
    except Exception:  # noqa: BLE001 - a damaged file is reported by load_weights with its own message
        return
    if recorded is not None and recorded != config_digest(config):
        raise ValueError(
            f"{where} and {weights_path} come from different saves (an interrupted or mixed save): the weights "
            "were written with another config.json. Re-save the head, or re-download it with `force_download=True`."
        )


def check_finite(state_dict: dict[str, torch.Tensor], what: str, fix: str) -> None:
    """Raise ``ValueError("<what> hold NaN or infinite values (`<tensor>`): <fix>")`` for the first such tensor."""
    for name, tensor in state_dict.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{what} hold NaN or infinite values (`{name}`): {fix}")


def check_weight_shapes(expected: dict[str, tuple], saved: dict[str, tuple], source: str, head: str) -> None:
    """Raise when a tensor both hold has another shape in ``saved`` (the file ``source``) than in ``expected`` (the
    ``head`` its config describes)."""
    wrong = [
        f"{name}: saved {saved[name]}, expected {expected[name]}"
        for name in sorted(expected.keys() & saved.keys())
        if saved[name] != expected[name]
    ]
    if wrong:
        raise ValueError(
            f"The weights in {source} do not fit the head its config describes ({head}): {wrong}. config.json and "
            "model.safetensors belong to different heads; re-save the head."
        )


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a ``model.safetensors`` file holds, read from its header (nothing is loaded)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as weights:
            return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a damaged header
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}): it is truncated or corrupted. Re-save the head "
            "with `head.save_pretrained(dir)`, or re-download it with `force_download=True`."
        ) from error


def holds_head(directory: Path, config: dict, state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether ``directory`` already holds a head with exactly this config and these weights (dtype included):
    the head its ``results.json`` / ``training_config.json`` describe, when it holds them."""
    config_path, weights_path = Path(directory) / CONFIG_NAME, Path(directory) / WEIGHTS_NAME
    if not config_path.is_file() or not weights_path.is_file():
        return False
    try:
        saved_config, saved = read_json(config_path, "Head config"), load_weights(weights_path)
    except (OSError, ValueError):
        return False
    if saved_config != json.loads(json.dumps(config, default=str)) or saved.keys() != state_dict.keys():
        return False
    return all(
        saved[name].dtype == tensor.dtype and torch.equal(saved[name], tensor.detach().cpu())
        for name, tensor in state_dict.items()
    )


#: ``.<name>.saving-<pid>-<random>``: the sibling directory a save into ``<name>`` writes its files to first
STAGING_INFIX = ".saving-"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: the process exists, under another user
        return True
    return True


def remove_stale_staging(directory: Path) -> list[Path]:
    """Remove the staging directories that saves into ``directory`` left behind when they were killed (their
    process is gone; a name without a process id is from an older release); returns them. Saves in progress stay."""
    prefix = f".{directory.name}{STAGING_INFIX}"
    removed = []
    for path in Path(directory).parent.glob(glob.escape(prefix) + "*"):
        pid = path.name[len(prefix) :].partition("-")[0]
        if path.is_dir() and not (pid.isdigit() and _process_alive(int(pid))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("removed the staging directories of interrupted saves: %s", [str(path) for path in removed])
    return removed


def new_staging_dir(directory: Path) -> Path:
    """A fresh sibling directory to write a save into ``directory`` (same filesystem: :func:`move_into_place` then
    moves atomically), after removing what killed saves left (:func:`remove_stale_staging`)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(directory)
    return Path(tempfile.mkdtemp(prefix=f".{directory.name}{STAGING_INFIX}{os.getpid()}-", dir=directory.parent))


def move_into_place(staging: Path, directory: Path, remove: Iterable[str] = ()) -> None:
    """Move every file of a complete ``staging`` directory into ``directory`` (created if needed), then remove it.

    The files named in ``remove`` (results of another head) are deleted from ``directory`` first. Each move is an
    atomic ``os.replace`` on one filesystem; ``model.safetensors`` goes last, so an interruption leaves a config
    whose digest the old weights do not match (an error at load, never a silent mix).
    """
    directory.mkdir(parents=True, exist_ok=True)
    for name in remove:
        (directory / name).unlink(missing_ok=True)
    for name in sorted((entry.name for entry in staging.iterdir()), key=lambda name: (name == WEIGHTS_NAME, name)):
        os.replace(staging / name, directory / name)
    staging.rmdir()


def count_parameters(path: Path) -> int:
    """Number of values stored in a ``model.safetensors`` file, read from its header (no tensor is loaded)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(path), framework="pt") as weights:
        for name in weights.keys():
            count = 1
            for size in weights.get_slice(name).get_shape():
                count *= size
            total += count
    return total


def require_token(token: str | None) -> str:
    """The token to push with: ``token``, else ``HF_TOKEN`` / the stored login; error before any network call."""
    token = token or huggingface_hub.get_token()
    if not token:
        raise PermissionError(
            "Pushing to the Hub needs a write token, and none was found: run `hf auth login`, set the HF_TOKEN "
            "environment variable, or pass `token=...` (`--token` on the command line)."
        )
    return token


def check_repo_id(repo_id: str) -> None:
    """Refuse a string that is no Hub repo id, naming it."""
    try:
        huggingface_hub.utils.validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"`repo_id` {repo_id!r} is not a valid Hub repo id ('org/name'): {error}") from error


def check_push(repo_id: str, token: str | None) -> str:
    """Everything a push can be refused for without the network (repo id, token, offline mode); returns the token."""
    check_repo_id(repo_id)
    token = require_token(token)
    if is_offline():
        raise ConnectionError(
            f"Cannot push to {repo_id!r}: offline mode is on (HF_HUB_OFFLINE=1). Unset it and retry with network "
            "access."
        )
    return token


@contextlib.contextmanager
def push_errors(repo_id: str) -> Iterator[None]:
    """Turn the Hub client's failures while pushing to ``repo_id`` into errors that say what to do."""
    try:
        yield
    except _network_error_types() as error:
        raise ConnectionError(
            f"Could not reach the Hub ({constants.ENDPOINT}) to push {repo_id!r}: {error}. Check your network "
            "connection and retry."
        ) from error
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403):
            raise PermissionError(
                f"The Hub refused the push to {repo_id!r} (HTTP {status}): the token is invalid or cannot write to "
                "this namespace. Use a write token (`hf auth login`) for an org you belong to."
            ) from error
        raise


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    branch: str | None = None,
    create_pr: bool | None = None,
    allow_patterns: Iterable[str] = REPO_FILES,
) -> str:
    """Create ``repo_id`` if needed and upload the head files in ``folder`` to it in one commit; returns the commit URL.

    For pushing a saved directory as it is (``diversed-hf push``); ``DiversedHead.push_to_hub`` pushes a head
    object. Fails before any network call without a token or in offline mode (:func:`check_push`).
    """
    token = check_push(repo_id, token)
    api = huggingface_hub.HfApi(token=token)
    with push_errors(repo_id):
        url = api.create_repo(repo_id=repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=url.repo_id,
            repo_type="model",
            folder_path=str(folder),
            commit_message=commit_message or DEFAULT_COMMIT_MESSAGE,
            revision=branch,
            create_pr=create_pr,
            allow_patterns=list(allow_patterns),
        )
    logger.info("pushed %s to %s", folder, commit)
    return str(commit)


def stage_repo_files(source_dir: Path, names: Iterable[str] = REPO_FILES) -> tempfile.TemporaryDirectory:
    """A temporary copy of the head repo files found in ``source_dir`` (caller cleans it up)."""
    staging = tempfile.TemporaryDirectory(prefix="diversed-head-")
    for name in names:
        if (Path(source_dir) / name).is_file():
            shutil.copy2(Path(source_dir) / name, Path(staging.name) / name)
    return staging
