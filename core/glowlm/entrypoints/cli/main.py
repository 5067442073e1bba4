"""``glowlm <verb>``: dispatch to one module per verb.

Each verb module has ``register(subparsers) -> None`` that adds its parser and
sets ``func`` (``args -> int`` exit code). A :class:`~glowlm.errors.GlowlmError`
escaping a verb is printed as one line on stderr with exit code 2: users see
what to fix, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from glowlm import __version__
from glowlm.errors import GlowlmError

VERBS = ("platforms", "collect_env", "generate", "serve", "bench", "models", "chat")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glowlm", description="CPU inference and serving for large language models."
    )
    parser.add_argument("--version", action="version", version=f"glowlm {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        try:
            module = importlib.import_module(f"glowlm.entrypoints.cli.{verb}")
        except ModuleNotFoundError as exc:
            if exc.name == f"glowlm.entrypoints.cli.{verb}":
                continue  # verb not built yet in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the real command line: maybe re-exec once with LD_PRELOAD
        try:
            from glowlm.runtime.preload import maybe_reexec, tune_glibc_malloc

            maybe_reexec()
            tune_glibc_malloc()  # where no tcmalloc was preloaded; before any thread
        except GlowlmError as exc:
            print(f"glowlm: error: {exc}", file=sys.stderr)
            return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except GlowlmError as exc:
        print(f"glowlm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("glowlm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `glowlm platforms | head`: the reader left, not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
