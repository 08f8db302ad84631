"""``diversed-hf push DIR --repo-id ORG/NAME`` and ``diversed-hf card DIR``: share heads from the command line.

Both print what they produced (the commit URL, the card paths) on stdout; the library functions
they call (:func:`diversed_hf.hub.push_directory`, :func:`diversed_hf.cards.write_card`) never print.
"""

from __future__ import annotations

from pathlib import Path

from . import hub

# Errors a user can fix: shown as one line, without a traceback.
_USER_ERRORS = (ValueError, TypeError, OSError)


def register(subparsers) -> None:
    push = subparsers.add_parser(
        "push",
        help="Upload a saved head directory to the Hugging Face Hub.",
        description="Load the head in DIR strictly, re-render its card for the repo, and upload config.json, "
        "model.safetensors, README.md, results.json and training_config.json in one commit. Needs a write token "
        "(hf auth login, HF_TOKEN or --token).",
    )
    push.add_argument("directory", metavar="DIR", help="Directory written by DiversedHead.save_pretrained.")
    push.add_argument("--repo-id", required=True, metavar="ORG/NAME", help="Hub repo to push to (created if missing).")
    push.add_argument("--token", default=None, help="Hub write token (default: HF_TOKEN or the stored login).")
    push.add_argument("--private", action="store_true", default=None, help="Create the repo as private.")
    push.add_argument("--branch", default=None, help="Branch to push to (default: main).")
    push.add_argument("--create-pr", action="store_true", default=None, help="Open a pull request instead of committing.")
    push.add_argument("--commit-message", default=None, help="Commit message.")
    push.add_argument("--keep-card", action="store_true", help="Upload DIR/README.md as it is instead of re-rendering it.")
    push.set_defaults(func=_run_push)

    card = subparsers.add_parser(
        "card",
        help="Re-render the model card (README.md) of saved heads.",
        description="Render the card of each head DIR into DIR/README.md from its config.json, results.json and "
        "training_config.json (result file format: see `python -c 'import diversed_hf.cards as c; help(c)'`).",
    )
    card.add_argument("directories", nargs="*", metavar="DIR", help="Head directories.")
    card.add_argument("--shipped", action="store_true", help="Also render every head shipped with the testbed.")
    card.add_argument("--results", default=None, metavar="FILE", help="Results file to use (copied to DIR/results.json).")
    card.add_argument(
        "--training-config", default=None, metavar="FILE", help="Training config file (copied to DIR/training_config.json)."
    )
    card.add_argument("--repo-id", default=None, metavar="ORG/NAME", help="Repo id the usage snippet loads.")
    card.add_argument(
        "--output-dir", default=None, metavar="DIR", help="Write <name>.md files here instead of each DIR/README.md."
    )
    card.set_defaults(func=_run_card)


def _run_push(args) -> int:
    try:
        url = hub.push_directory(
            args.directory,
            args.repo_id,
            token=args.token,
            private=args.private,
            commit_message=args.commit_message,
            branch=args.branch,
            create_pr=args.create_pr,
            keep_card=args.keep_card,
        )
    except _USER_ERRORS as error:
        raise SystemExit(f"diversed-hf push: {error}") from None
    print(url)
    return 0


def _run_card(args) -> int:
    from . import cards

    directories = [Path(d) for d in args.directories]
    if args.shipped:
        directories += cards.shipped_head_dirs()
    if not directories:
        raise SystemExit("diversed-hf card: give at least one head DIR, or --shipped.")
    if (args.results or args.training_config) and len(directories) != 1:
        raise SystemExit("diversed-hf card: --results and --training-config need exactly one DIR.")
    for directory in directories:
        if not (directory / hub.CONFIG_NAME).is_file():
            raise SystemExit(f"diversed-hf card: {directory} has no {hub.CONFIG_NAME}; is it a saved head directory?")
        output = Path(args.output_dir) / f"{directory.name}.md" if args.output_dir else None
        try:
            if args.results:
                cards.write_results(directory / hub.RESULTS_NAME, args.results)
            if args.training_config:
                cards.write_training_config(directory / hub.TRAINING_CONFIG_NAME, args.training_config)
            path = cards.write_card(directory, repo_id=args.repo_id, output=output)
        except _USER_ERRORS as error:
            raise SystemExit(f"diversed-hf card: {error}") from None
        print(path)
    return 0
