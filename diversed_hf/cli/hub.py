"""``diversed-hf push DIR --repo-id ORG/NAME`` and ``diversed-hf card DIR``: share heads from the command line;
``diversed-hf push --custom-generate --repo-id ORG/NAME`` publishes the ``custom_generate`` method (the package's
``hub_repo`` folder, :data:`diversed_hf.generation.CUSTOM_GENERATE_REPO`).

Both print what they produced (the commit URL, the card paths) on stdout; the functions they call
(:func:`push_directory`, :func:`render_shipped_cards`, :func:`diversed_hf.heads.cards.write_card`) never print.
This is the command layer: it may use the testbed (the heads shipped with it), which the library never imports.
Errors are ``ValueError`` / ``OSError``, which ``diversed-hf`` shows as one line with exit status 2. ``card``
checks every input and renders every card before it writes anything, and replaces each file atomically.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

from ..generation.mixin import CUSTOM_GENERATE_REPO
from ..heads import cards, hub
from ..heads.head import DiversedHead, DiversedHeadConfig
from ..lab.cli_utils import check_output_dir, write_text_atomic

logger = logging.getLogger(__name__)

#: the files of the ``custom_generate`` repository, relative to it (transformers' documented layout)
CUSTOM_GENERATE_FILES = ("README.md", "custom_generate/generate.py", "custom_generate/requirements.txt")


def register(subparsers) -> None:
    push = subparsers.add_parser(
        "push",
        help="Upload a saved head, or the custom_generate method, to the Hugging Face Hub (needs the Hub and a token).",
        description="Load the head in DIR strictly, re-render its card for the repo, and upload config.json, "
        "model.safetensors, README.md, results.json and training_config.json in one commit; or, with "
        "--custom-generate, upload the DIVERSED custom_generate repository (README.md, custom_generate/generate.py, "
        "custom_generate/requirements.txt) that `model.generate(..., custom_generate=ORG/NAME, "
        "trust_remote_code=True)` runs. Needs a write token (hf auth login, HF_TOKEN or --token).",
    )
    push.add_argument("directory", metavar="DIR", nargs="?", help="Directory written by DiversedHead.save_pretrained.")
    push.add_argument(
        "--custom-generate",
        "--custom_generate",
        action="store_true",
        help="Push the custom_generate method shipped with diversed_hf instead of a head DIR.",
    )
    push.add_argument("--repo-id", required=True, metavar="ORG/NAME", help="Hub repo to push to (created if missing).")
    push.add_argument("--token", default=None, help="Hub write token (default: HF_TOKEN or the stored login).")
    push.add_argument("--private", action="store_true", default=None, help="Create the repo as private.")
    push.add_argument("--branch", default=None, help="Branch to push to (default: main).")
    push.add_argument(
        "--create-pr", action="store_true", default=None, help="Open a pull request instead of committing."
    )
    push.add_argument("--commit-message", default=None, help="Commit message.")
    push.add_argument(
        "--keep-card", action="store_true", help="Upload DIR/README.md as it is instead of re-rendering it."
    )
    push.set_defaults(func=_run_push)

    card = subparsers.add_parser(
        "card",
        help="Re-render the model card (README.md) of saved heads.",
        description="Render the card of each head DIR into DIR/README.md from its config.json, results.json and "
        "training_config.json (result file format: see `python -c 'import diversed_hf.heads.cards as c; help(c)'`).",
    )
    card.add_argument("directories", nargs="*", metavar="DIR", help="Head directories.")
    card.add_argument(
        "--shipped",
        action="store_true",
        help="Also render every head shipped with the testbed, and the real pair's drafts and adapter.",
    )
    card.add_argument(
        "--results", default=None, metavar="FILE", help="Results file to use (copied to DIR/results.json)."
    )
    card.add_argument(
        "--training-config",
        default=None,
        metavar="FILE",
        help="Training config file (copied to DIR/training_config.json).",
    )
    card.add_argument("--repo-id", default=None, metavar="ORG/NAME", help="Repo id the usage snippet loads.")
    card.add_argument(
        "--output-dir", default=None, metavar="DIR", help="Write <name>.md files here instead of each DIR/README.md."
    )
    card.set_defaults(func=_run_card)


def push_directory(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    branch: str | None = None,
    create_pr: bool | None = None,
    keep_card: bool = False,
) -> str:
    """Push a saved head directory as it is (config, weights, results, training config) to ``repo_id``.

    The head is first loaded strictly, so a broken directory never reaches the Hub; the card is
    re-rendered for ``repo_id`` in a staging copy (``keep_card=True`` uploads the README.md as it is).
    """
    directory = Path(directory)
    hub.check_repo_id(repo_id)  # what the call names first: the repo id, then the folder, then the token
    DiversedHead.from_pretrained(directory)
    token = hub.require_token(token)  # before any network call
    staging = hub.stage_repo_files(directory)
    try:
        if not keep_card or not (directory / hub.CARD_NAME).is_file():
            cards.write_card(staging.name, repo_id=repo_id, task_card=registered_task_card(staging.name))
        return hub.push_folder(
            staging.name,
            repo_id,
            token=token,
            private=private,
            commit_message=commit_message,
            branch=branch,
            create_pr=create_pr,
        )
    finally:
        staging.cleanup()


def custom_generate_files() -> list[Path]:
    """The files of the ``custom_generate`` repository shipped with the package (:data:`CUSTOM_GENERATE_FILES`)."""
    files = [Path(CUSTOM_GENERATE_REPO) / name for name in CUSTOM_GENERATE_FILES]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise OSError(
            f"the installed diversed_hf lacks {missing}: reinstall it (`pip install --force-reinstall diversed_hf`)."
        )
    return files


def push_custom_generate(
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    branch: str | None = None,
    create_pr: bool | None = None,
) -> str:
    """Push the ``custom_generate`` repository (:data:`CUSTOM_GENERATE_FILES`) to ``repo_id``; returns the commit
    URL."""
    custom_generate_files()  # every file present, before the network
    return hub.push_folder(
        CUSTOM_GENERATE_REPO,
        repo_id,
        token=token,
        private=private,
        commit_message=commit_message or "Upload the DIVERSED custom_generate method",
        branch=branch,
        create_pr=create_pr,
        allow_patterns=CUSTOM_GENERATE_FILES,
    )


def shipped_head_dirs() -> list[Path]:
    """Directories of the heads shipped in the testbed's assets (folders whose config.json is a head's)."""
    from .. import testbed  # the command layer only: the library never imports the testbed

    heads = []
    folders = (testbed.ASSETS_DIR, *(testbed.head_folder(pair) for pair in testbed.HEAD_HOMES))
    candidates = [path for folder in folders if folder.is_dir() for path in sorted(folder.iterdir())]
    for candidate in candidates:
        config_path = candidate / hub.CONFIG_NAME
        if config_path.is_file():
            try:
                values = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(values, dict) and "draft_hidden_size" in values and "target_hidden_size" in values:
                heads.append(candidate)
    return heads


def registered_task_card(directory: str | os.PathLike) -> dict | None:
    """The task registry's card facts of the task the head in ``directory`` names (None for none or an unknown
    task): what the card says of a task its ``training_config.json`` does not record."""
    from ..lab.tasks import task_card

    return task_card(hub.read_head_config(hub.resolve_file(Path(directory), hub.CONFIG_NAME)).get("task"))


def render_shipped_cards(output_dir: str | os.PathLike = "model_cards") -> list[Path]:
    """Render every shipped head's card again: ``<output_dir>/<head name>.md``, and its README.md in the assets
    through the one writer of the assets (:func:`diversed_hf.cli.ship.ship`). Returns the cards in ``output_dir``."""
    import tempfile

    from .. import testbed
    from . import ship as shipping

    # model_cards/<prefix><task>.md
    prefixes = {testbed.head_folder(pair): card for pair, (_, _, card) in testbed.HEAD_HOMES.items()}
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as run:
        staged = []
        for directory in shipped_head_dirs():
            name = directory.relative_to(testbed.ASSETS_DIR).as_posix()
            rendered = Path(run) / "rendered" / name / hub.CARD_NAME
            cards.write_card(directory, output=rendered, task_card=registered_task_card(directory))
            card_name = f"{prefixes.get(directory.parent, '')}{directory.name}.md"
            staged.append(shipping.stage(run, name, {hub.CARD_NAME: rendered}, card=card_name))
            written.append(output_dir / card_name)
        for folder in staged:
            shipping.ship(folder, cards_dir=output_dir)
    if not written:
        logger.warning("no shipped heads found in the testbed assets; nothing rendered")
    return written


def shipped_models() -> list[tuple[Path, str, str]]:
    """``(directory, kind, card name in model_cards/)`` of the drafts and adapters shipped with the real pair."""
    from ..testbed import smollm2, smollm2_tuned

    return [
        (smollm2.EAGLE_DIR, "eagle", "smollm2_eagle_draft.md"),
        (smollm2.EAGLE_TASKS_DIR, "eagle", "smollm2_eagle_tasks_draft.md"),
        (smollm2.EAGLE3_DIR, "eagle", "smollm2_eagle3_draft.md"),
        (smollm2_tuned.TUNED_DIR, "tuned", "smollm2_tuned_target.md"),
        (smollm2_tuned.TUNED_EAGLE_DIR, "eagle", "smollm2_tuned_eagle_draft.md"),
    ]


def shipped_model_cards() -> list[tuple[Path, str, str]]:
    """``(directory, card name, card)`` of every shipped draft and adapter, rendered from its ``training.json``
    through the same template system as the heads' cards; those not shipped are left out."""
    from ..drafting.eagle import EagleDraftConfig
    from ..training.eagle_card import render_eagle_card
    from ..training.tuned_card import render_tuned_card

    rendered = []
    for directory, kind, name in shipped_models():
        if not (directory / "training.json").is_file():
            continue
        record = json.loads((directory / "training.json").read_text())
        card = (
            render_eagle_card(EagleDraftConfig.from_pretrained(directory), record)
            if kind == "eagle"
            else render_tuned_card(record)
        )
        rendered.append((directory, name, card))
    return rendered


def render_shipped_model_cards(output_dir: str | os.PathLike = "model_cards") -> list[Path]:
    """Write each shipped draft's and adapter's card (:func:`shipped_model_cards`) into ``<output_dir>/<name>``, and
    beside it (``README.md``) through the one writer of the assets (:func:`diversed_hf.cli.ship.ship`)."""
    import tempfile

    from .. import testbed
    from . import ship as shipping

    shipped = Path(testbed.__file__).resolve().parent / "assets"  # where the models' folders are defined
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as run:
        for directory, name, card in shipped_model_cards():
            asset = directory.relative_to(shipped).as_posix()
            written += shipping.ship(shipping.stage(run, asset, {"README.md": card}, card=name), cards_dir=output_dir)
    return written


@contextlib.contextmanager
def _type_errors_as_value_errors():
    """A wrong type in a file the user gave (a config value, a result field) is a user error: one line, status 2."""
    try:
        yield
    except TypeError as error:
        raise ValueError(str(error)) from error


def _run_push(args) -> int:
    if (args.directory is None) == (not args.custom_generate):
        raise ValueError(
            "give a head DIR or --custom-generate"
            + (", not both." if args.custom_generate else " (e.g. `diversed-hf push runs/head --repo-id ORG/NAME`).")
        )
    options = dict(
        token=args.token,
        private=args.private,
        commit_message=args.commit_message,
        branch=args.branch,
        create_pr=args.create_pr,
    )
    if args.custom_generate:
        print(push_custom_generate(args.repo_id, **options))
        return 0
    with _type_errors_as_value_errors():
        url = push_directory(args.directory, args.repo_id, keep_card=args.keep_card, **options)
    print(url)
    return 0


def _run_card(args) -> int:
    """Check every input and render every card first; only then write, each file replaced atomically. A bad
    results file, training config or head config leaves every directory as it was."""
    directories = [Path(d) for d in args.directories]
    if args.shipped:
        directories += shipped_head_dirs()
    if not directories:
        raise ValueError("give at least one head DIR, or --shipped.")
    if (args.results or args.training_config) and len(directories) != 1:
        raise ValueError(f"--results and --training-config need exactly one DIR, got {len(directories)}.")
    if args.output_dir:
        check_output_dir(args.output_dir)
    staged = []  # (final path, text) of every file to write
    with tempfile.TemporaryDirectory(prefix="diversed-card-") as scratch, _type_errors_as_value_errors():
        for index, directory in enumerate(directories):
            if not (directory / hub.CONFIG_NAME).is_file():
                raise ValueError(f"{directory} has no {hub.CONFIG_NAME}; is it a saved head directory?")
            DiversedHeadConfig.from_json_file(directory / hub.CONFIG_NAME)  # every value checked, not just the file
            if args.results:
                cards.load_results(args.results)  # checked before anything is written
                staged.append((directory / hub.RESULTS_NAME, Path(args.results).read_text(encoding="utf-8")))
            if args.training_config:
                values = cards.load_training_config(args.training_config)
                staged.append(
                    (
                        directory / hub.TRAINING_CONFIG_NAME,
                        json.dumps(values, indent=2, sort_keys=True, default=str) + "\n",
                    )
                )
            rendered = cards.write_card(  # rendered with the new files, into scratch space
                directory,
                repo_id=args.repo_id,
                results=args.results,
                training_config=args.training_config,
                output=Path(scratch) / f"{index}.md",
                task_card=registered_task_card(directory),
            )
            output = Path(args.output_dir) / f"{directory.name}.md" if args.output_dir else directory / hub.CARD_NAME
            staged.append((output, rendered.read_text(encoding="utf-8")))
    for path, text in staged:
        if path.suffix == ".json" and path.is_file() and path.read_text(encoding="utf-8") == text:
            continue  # --results DIR/results.json: already in place
        write_text_atomic(path, text)
        if path.suffix == ".md":
            print(path)
    if args.shipped:  # the shipped drafts' and adapter's cards too, into model_cards/ with --output-dir
        for path in render_shipped_model_cards(args.output_dir or "model_cards"):
            print(path)
    return 0
