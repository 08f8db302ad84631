"""``diversed-hf ship RUN [--as NAME]``: the one writer of the testbed's shipped assets.

A measurement or training script never writes into the package. It *stages* what it would ship in its own run
folder (:func:`stage`: ``RUN/shipments/<name>/``, the files and a ``shipment.json`` naming the asset folder they
replace files in and the card they render), and then, unless told not to (``--no_ship``), calls :func:`ship`, which
copies them into ``diversed_hf/testbed/assets/<name>`` and the card into ``model_cards/``. A staged run can be
shipped later by hand, or under another name::

    python benchmarks/everyday_results.py --no_ship          # measure; results/everyday/shipments/smollm2__eagle
    diversed-hf ship results/everyday                        # ship it as staged (smollm2/eagle)
    diversed-hf ship results/everyday --as smollm2/eagle_v2  # or as a new asset folder

A recipe's output folder (a trained draft, head or judge: plain files, no staged shipment) ships whole under the name
``--as`` gives, its README.md becoming ``model_cards/<--card>`` when ``--card`` is given::

    python training/train_eagle_draft.py --output_dir runs/eagle   # the draft in runs/eagle/draft
    diversed-hf ship runs/eagle/draft --as smollm2/eagle --card smollm2_eagle_draft.md

A shipment replaces the files it names and leaves the folder's others (a draft's weights stay when only its
generation config and card change). See docs/architecture.md ("Who writes what").
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..lab.cli_utils import write_text_atomic

logger = logging.getLogger(__name__)

#: a run folder's staged shipments: RUN/shipments/<name with "/" as "__">/
SHIPMENTS = "shipments"
#: what a staged shipment records: {"as": name, "card": file name in model_cards/ or null, "files": [...], ...}
MANIFEST = "shipment.json"
#: the staged file a shipment's card is copied from
CARD_FILE = "README.md"
#: the repository's model_cards/ (absent from an installed wheel: a card is then left in the asset folder only)
CARDS_DIR = Path(__file__).resolve().parents[2] / "model_cards"
_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


def check_name(name: str, argument: str = "--as") -> str:
    """``name`` as a folder under the assets (``smollm2/eagle``, ``heads/arith``), refused by name otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or any(part in (".", "..") for part in name.split("/")):
        raise ValueError(
            f"{argument}={name!r} is not an asset folder: give a relative path of plain names under "
            "diversed_hf/testbed/assets, e.g. smollm2/eagle or heads/arith"
        )
    return name


def stage(
    run_dir: str | os.PathLike,
    name: str,
    files: Mapping[str, str | bytes | os.PathLike],
    *,
    card: str | None = None,
    measured_by: str | None = None,
) -> Path:
    """Stage ``files`` (file name -> text, bytes, or a path to copy) to ship as the asset folder ``name``; ``card``
    names the file in ``model_cards/`` that the staged README.md becomes. A second stage of the same name replaces
    the first whole. Returns the staged folder."""
    check_name(name, "name")
    if card is not None and CARD_FILE not in files:
        raise ValueError(f"card={card!r} needs a {CARD_FILE} among the staged files (got {sorted(files)})")
    folder = Path(run_dir) / SHIPMENTS / name.replace("/", "__")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for file_name, content in files.items():
        if "/" in file_name or file_name in (MANIFEST, "", ".", ".."):
            raise ValueError(f"files: {file_name!r} is not a plain file name a shipment can carry")
        target = folder / file_name
        if isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            shutil.copyfile(content, target)
    manifest = {"as": name, "card": card, "files": sorted(files), "measured_by": measured_by}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return folder


def stage_folder(
    run_dir: str | os.PathLike,
    name: str,
    folder: str | os.PathLike,
    *,
    card: str | None = None,
    measured_by: str | None = None,
) -> Path:
    """Stage every plain file of ``folder`` (a saved head, a trained judge) to ship as ``name``."""
    files = {path.name: path for path in sorted(Path(folder).iterdir()) if path.is_file()}
    if not files:
        raise ValueError(f"folder={str(folder)!r} holds no file to ship")
    return stage(run_dir, name, files, card=card, measured_by=measured_by)


def shipments(run: str | os.PathLike) -> list[Path]:
    """The staged shipments of ``run``: a run folder (its ``shipments/*``) or one staged folder."""
    run = Path(run)
    if (run / MANIFEST).is_file():
        return [run]
    found = sorted(path.parent for path in (run / SHIPMENTS).glob(f"*/{MANIFEST}"))
    if not found:
        raise ValueError(
            f"RUN={str(run)!r} holds no staged shipment ({run / SHIPMENTS}/*/{MANIFEST}): a script stages one in its "
            "output folder when it measures something to ship (its --no_ship run too)"
        )
    return found


def ship(
    run: str | os.PathLike,
    name: str | None = None,
    *,
    card: str | None = None,
    assets_dir: str | os.PathLike | None = None,
    cards_dir: str | os.PathLike | None = None,
) -> list[Path]:
    """Copy the staged shipments of ``run`` into the assets (``name`` renames the one shipment; default: as staged)
    and their cards into ``cards_dir`` (default the repository's ``model_cards/``); or, when ``run`` is a recipe's
    output folder (plain files, nothing staged), the folder whole as ``name`` with its README.md as ``card``.
    Returns the files written."""
    run = Path(run)
    if _is_model_folder(run):
        if name is None:
            raise ValueError(
                f"RUN={str(run)!r} is a saved model folder, not a staged run: name the asset it becomes with --as "
                "(e.g. --as smollm2/eagle)"
            )
        with tempfile.TemporaryDirectory() as temporary:
            staged = stage_folder(temporary, name, run, card=card)
            return ship(staged, assets_dir=assets_dir, cards_dir=cards_dir)
    if card is not None:
        raise ValueError(f"--card={card!r} is for a saved model folder; a staged shipment names its own card")
    staged = shipments(run)
    if name is not None:
        check_name(name)
        if len(staged) > 1:
            raise ValueError(
                f"--as={name!r} names one asset but RUN={str(run)!r} stages {len(staged)} shipments "
                f"({', '.join(folder.name for folder in staged)}): ship one staged folder with --as"
            )
    if assets_dir is None:
        from .. import testbed  # the command layer only

        assets_dir = testbed.ASSETS_DIR
    cards_dir = CARDS_DIR if cards_dir is None else Path(cards_dir)
    written = []
    for folder in staged:
        written += _ship_one(folder, name, Path(assets_dir), cards_dir)
    return written


#: the files that make a folder a saved model, head, adapter or tokenizer (what a recipe writes)
MODEL_FILES = ("config.json", "adapter_config.json", "tokenizer.json", "tokenizer_config.json")


def _is_model_folder(run: Path) -> bool:
    return (
        run.is_dir()
        and not (run / MANIFEST).exists()
        and not (run / SHIPMENTS).exists()
        and any((run / name).is_file() for name in MODEL_FILES)
    )


def _ship_one(folder: Path, name: str | None, assets_dir: Path, cards_dir: Path) -> list[Path]:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    name = check_name(name or manifest["as"], "as")
    missing = [file_name for file_name in manifest["files"] if not (folder / file_name).is_file()]
    if missing:
        raise ValueError(f"the shipment {folder} lacks the files its {MANIFEST} lists: {missing}; stage it again")
    destination = assets_dir / name
    _check_kind(folder, destination)
    destination.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name in manifest["files"]:
        written.append(_copy_atomic(folder / file_name, destination / file_name))
    if manifest.get("card"):
        if cards_dir.is_dir():
            text = (folder / CARD_FILE).read_text(encoding="utf-8")
            written.append(write_text_atomic(cards_dir / manifest["card"], text))
        else:
            logger.warning("no %s here: the card of %s stays in the asset folder only", cards_dir, name)
    logger.info("shipped %s as %s (%d files)", folder, destination, len(written))
    return written


def _check_kind(folder: Path, destination: Path) -> None:
    """Refuse a shipment whose config is another kind of model than the one it would replace (a head's config over
    a draft's, say)."""
    staged, present = folder / "config.json", destination / "config.json"
    if not (staged.is_file() and present.is_file()):
        return
    kinds = [_kind(json.loads(path.read_text(encoding="utf-8"))) for path in (staged, present)]
    if kinds[0] != kinds[1]:
        raise ValueError(
            f"the shipment {folder} holds a {kinds[0]} config but {destination} holds a {kinds[1]}: ship it under "
            "another --as name"
        )


def _kind(config: dict) -> str:
    if "draft_hidden_size" in config and "target_hidden_size" in config:
        return "head"
    return str(config.get("model_type", "model"))


def _copy_atomic(source: Path, target: Path) -> Path:
    temporary = target.with_name(f".{target.name}.shipping")
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)
    return target


def stage_eagle_update(
    run_dir: str | os.PathLike,
    name: str,
    generation_config,
    record: dict,
    card: str,
    measured_by: str | None = None,
) -> Path:
    """Stage a shipped EagleDraft's new generation config and training record, with the card they render (its
    weights and config stay as shipped)."""
    from .. import testbed
    from ..drafting.eagle import EagleDraftConfig
    from ..training.eagle_card import render_eagle_card

    config = EagleDraftConfig.from_pretrained(testbed.ASSETS_DIR / check_name(name, "name"))
    files = {
        "generation_config.json": generation_config.to_json_string(use_diff=True),
        "training.json": json.dumps(record, indent=2) + "\n",
        CARD_FILE: render_eagle_card(config, record),
    }
    return stage(run_dir, name, files, card=card, measured_by=measured_by)


class Destination:
    """Where a recipe writes what an output argument names (:func:`save_location`): ``folder``, then
    :meth:`finish` ships it as ``ship_as`` when the argument named a folder in the testbed's assets."""

    def __init__(self, folder: Path, ship_as: str | None):
        self.folder, self.ship_as = folder, ship_as

    def finish(self, card: str | None = None) -> list[Path]:
        """Ship the written folder (nothing when it was written in place); ``""`` ships each of its folders by name
        (a whole testbed: tokenizer/, target/, draft/)."""
        if self.ship_as is None:
            return []
        if self.ship_as == "":
            return [path for sub in sorted(self.folder.iterdir()) if sub.is_dir() for path in ship(sub, sub.name)]
        return ship(self.folder, self.ship_as, card=card)


def save_location(path: str | os.PathLike, flag: str, run_dir: str | os.PathLike) -> Destination:
    """Where a recipe writes the folder ``flag`` names: ``path`` itself, or, when ``path`` lies in the testbed's
    assets (``--save_to diversed_hf/testbed/assets/smollm2/eagle``), a folder under ``run_dir/to_ship`` that
    :meth:`Destination.finish` ships there once written -- the recipe never writes into the package itself."""
    from .. import testbed

    path, assets = Path(path).expanduser().resolve(), testbed.ASSETS_DIR.resolve()
    if not path.is_relative_to(assets):
        return Destination(Path(path), None)
    name = path.relative_to(assets).as_posix()
    if name == ".":
        return Destination(Path(run_dir).resolve() / "to_ship" / "assets", "")
    check_name(name, flag)
    return Destination(Path(run_dir).resolve() / "to_ship" / name.replace("/", "__"), name)


def _run(args) -> int:
    for path in ship(args.run, args.as_name, card=args.card, assets_dir=args.assets_dir, cards_dir=args.cards_dir):
        print(path)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ship",
        help="Copy a measured run's staged shipment into the testbed's assets, with its card.",
        description="Copy what a measurement or training run staged (RUN/shipments/*) into the testbed's assets and "
        "its card into model_cards/; or a saved model folder, whole, as the --as name. The one writer of the assets.",
    )
    parser.add_argument(
        "run", help="a run folder with staged shipments (RUN/shipments/*), one staged folder, or a saved model folder"
    )
    parser.add_argument("--as", dest="as_name", default=None, help="the asset folder to ship as (default: as staged)")
    parser.add_argument("--card", default=None, help="a model folder's card name in model_cards/ (e.g. smollm2_x.md)")
    parser.add_argument("--assets_dir", default=None, help="the assets to ship into (default: the testbed's)")
    parser.add_argument("--cards_dir", default=None, help="where the card goes (default: the repository's model_cards)")
    parser.set_defaults(func=_run)
