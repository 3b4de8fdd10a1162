"""The `vramlab` command: a table of subcommands, each loaded only when it runs.

Every subcommand lives in its own module under `vramlab.cli` and exposes
`add_arguments(parser)` and `run(args) -> int | None`. Nothing heavy is imported here,
so `vramlab --help` and `vramlab plan` start fast.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from vramlab import __version__

# name -> (module, one-line help). Keep the order: it is the order of --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": (
        "vramlab.cli.plan",
        "predict the VRAM breakdown and capacity of a model on a GPU under an engine",
    ),
    "models": ("vramlab.cli.models", "list the bundled model catalog"),
    "gpus": ("vramlab.cli.gpus", "list the GPU catalog"),
    "check-log": ("vramlab.cli.check_log", "compare an engine start-up log with the prediction"),
    "calibrate": ("vramlab.cli.calibrate", "fit the model's constants to logs and measurements"),
    "sim": ("vramlab.cli.sim", "rehearsal GPU inference server, simulated card, balloon"),
    "run": ("vramlab.cli.run", "run a controlled experiment plan against an endpoint"),
    "runs": ("vramlab.cli.runs", "list stored runs"),
    "report": ("vramlab.cli.report", "render a stored run as Markdown, HTML or JSON"),
    "compare": ("vramlab.cli.compare", "compare two stored runs"),
    "examples": ("vramlab.cli.examples", "write the example plans (experiment, drills, fleet) into a folder"),
    "demo": (
        "vramlab.cli.demo",
        "start the rehearsal server, run a small plan and the OOM drill, write both reports",
    ),
    "drill": ("vramlab.cli.drill", "run an OOM drill and write the incident report"),
    "note": ("vramlab.cli.note", "add an operator note to a run's timeline"),
    "alerts": ("vramlab.cli.alerts", "write Prometheus alerting rules for a plan"),
    "pack": ("vramlab.cli.pack", "place several models on shared GPUs and simulate residency"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Commands whose module exists (so a half-built tree still has a working --help)."""
    import importlib.util

    return {n: v for n, v in COMMANDS.items() if importlib.util.find_spec(v[0]) is not None}


def _print_help() -> None:
    cmds = _available()
    width = max(len(n) for n in cmds) if cmds else 8
    lines = [
        "usage: vramlab COMMAND [options]",
        "",
        "Plan GPU memory for LLM serving, run controlled experiments and OOM drills.",
        "",
        "commands:",
    ]
    lines += [f"  {n.ljust(width)}  {h}" for n, (_, h) in cmds.items()]
    lines += [
        "",
        "options:",
        "  -h, --help     show this help",
        "  --version      show the version",
        "",
        "Run `vramlab COMMAND --help` for a command's options. Byte figures print in GiB (2^30 bytes).",
    ]
    print("\n".join(lines))


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage block is one `--help` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see `{self.prog} --help`)\n")


def _first_paragraph(doc: str) -> str:
    """A module docstring's first paragraph as one line: the whole sentence, never its first line alone."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def build_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The parser of one subcommand and its module."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = _Parser(
        prog=f"vramlab {name}",
        description=_first_paragraph(getattr(module, "__doc__", None) or help_text),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        _print_help()
        return 0
    if argv[0] == "--version":
        print(f"vramlab {__version__}")
        return 0
    name = argv[0]
    if name not in _available():
        from vramlab.errors import near_matches

        hint = near_matches(name, list(_available()))
        extra = f"; did you mean {', '.join(hint)}?" if hint else ""
        print(f"vramlab: error: unknown command {name!r}{extra} (see `vramlab --help`)", file=sys.stderr)
        return 2
    parser, module = build_parser(name)
    args = parser.parse_args(argv[1:])
    return _run(name, module, args)


def _run(name: str, module: object, args: argparse.Namespace) -> int:
    from vramlab.redact import RedactingStream

    # Everything this process prints passes the redaction layer (URL passwords, keys, tokens).
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err)
    try:
        code = _run_guarded(name, module, args)
        try:
            sys.stdout.flush()  # a full disk under stdout shows here at the latest, not at exit
        except BrokenPipeError:
            _drop_stdout()
        except OSError:
            return _stdout_failed(name)
        return code
    finally:
        if isinstance(sys.stdout, RedactingStream):
            sys.stdout = out
        if isinstance(sys.stderr, RedactingStream):
            sys.stderr = err


def _run_guarded(name: str, module: object, args: argparse.Namespace) -> int:
    from vramlab.errors import VramlabError
    from vramlab.redact import RedactingStream

    try:
        code = module.run(args)  # type: ignore[attr-defined]
        return int(code or 0)
    except VramlabError as exc:
        print(f"vramlab {name}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"vramlab {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `vramlab models | head`: the reader went away; that is not an error.
        _drop_stdout()
        return 0
    except OSError as exc:
        if isinstance(sys.stdout, RedactingStream) and sys.stdout.failed is exc:
            return _stdout_failed(name)
        if exc.errno == errno.ENAMETOOLONG:  # only a name the user gave can be too long for a path
            what = str(exc.filename or "")
            shown = what if len(what) <= 60 else what[:57] + "..."
            print(
                f"vramlab {name}: error: {shown!r}: a name longer than the file system allows "
                f"({len(what)} characters)",
                file=sys.stderr,
            )
            return 2
        return _internal_error(name, exc)
    except Exception as exc:  # the last line of defence: never a traceback for users
        return _internal_error(name, exc)


def _internal_error(name: str, exc: Exception) -> int:
    if os.environ.get("VRAMLAB_DEBUG"):
        raise exc
    print(
        f"vramlab {name}: internal error: {type(exc).__name__}: {exc} "
        "(set VRAMLAB_DEBUG=1 to see the traceback)",
        file=sys.stderr,
    )
    return 70


def _drop_stdout() -> None:
    """Send what is still to come, and what the interpreter flushes at exit, to /dev/null."""
    try:
        sys.stdout = open(os.devnull, "w")
        os.dup2(sys.stdout.fileno(), 1)
    except OSError:
        pass


def _stdout_failed(name: str) -> int:
    """Standard output refused a write (a full disk, /dev/full): one line on stderr, exit 1; what
    is still buffered is dropped so the interpreter's own flush at exit cannot fail again."""
    from vramlab.redact import RedactingStream

    stream = sys.stdout
    exc = stream.failed if isinstance(stream, RedactingStream) else None
    why = (exc.strerror if exc is not None else None) or "write failed"
    _drop_stdout()
    print(f"vramlab {name}: error: cannot write to standard output: {why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
