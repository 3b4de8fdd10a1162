"""Write the packaged example plans and inputs (demo, concurrency ramp, drills, fleet) into DIR.

The copies inside the installed package are the source of truth; this command is how a user gets
them in any folder after `pip install .`, e.g. `vramlab examples && vramlab run examples/concurrency-ramp.yaml`.
Files already there with the same content are left alone; a file that differs is refused unless --force.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def packaged() -> dict[str, bytes]:
    """name -> content of every packaged example, sorted by name."""
    from importlib.resources import files

    root = files("vramlab").joinpath("data/examples")
    return {
        p.name: p.read_bytes()
        for p in sorted(root.iterdir(), key=lambda p: p.name)
        if p.is_file() and p.name.endswith((".yaml", ".jsonl", ".csv"))
    }


def _content(path: Path) -> bytes | None:
    """What is at *path* (None: nothing). Read as any input is: a FIFO, a device or a folder in
    the way is never opened, and reads as something different from every example."""
    import os

    from vramlab.errors import ConfigError
    from vramlab.infile import read_bytes

    if not os.path.lexists(path):
        return None
    try:
        return read_bytes(path, "example", 1 << 20)
    except ConfigError:
        return b"\0(not a regular file)"


def write_examples(target: Path, force: bool = False) -> tuple[list[str], list[str]]:
    """Write them; returns (written, unchanged). Refuses (ConfigError) before writing anything when
    a file that differs is in the way and force is off."""
    from vramlab.errors import ConfigError, VramlabError

    files = packaged()
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} exists and is not a folder")
    clash = [n for n, data in files.items() if _content(target / n) not in (None, data)]
    if clash and not force:
        raise ConfigError(
            f"{target}: {', '.join(clash)} already there and different; pass --force to overwrite"
        )
    written, same = [], []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            path = target / name
            if path.is_symlink():
                path.unlink()
            elif _content(path) == data:
                same.append(name)
                continue
            elif path.exists() and not path.is_file():  # a FIFO or a device would block or swallow the write
                raise ConfigError(f"{path} is in the way and is not a regular file")
            path.write_bytes(data)
            written.append(name)
    except OSError as exc:
        raise VramlabError(f"cannot write examples into {target}: {exc.strerror or exc}") from None
    return written, same


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        default="examples",
        help="folder to write them into (default ./examples)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite files that differ")


def run(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    written, same = write_examples(target, args.force)
    for name in written:
        print(f"wrote {target / name}")
    if same:
        print(f"{len(same)} already up to date in {target}", file=sys.stderr)
    print(
        f"next: vramlab run {target / 'concurrency-ramp.yaml'}   |   vramlab drill {target / 'oom-drill.yaml'}",
        file=sys.stderr,
    )
    return 0
