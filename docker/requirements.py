"""Print the third-party requirements of glowlm's packages, one per line, for pip -r.

Why: the image installs these in a layer of their own, keyed on the pyproject files
only, so that editing a source file rebuilds the kernels but does not download the
dependencies again. glowlm's own packages (``glowlm*``) are skipped: they come from
the checkout in the next layer. Environment markers are left for pip to evaluate.

    python docker/requirements.py core kernels plugins/x86 'plugins/zen[zentorch]'
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirements(package_dir: str) -> list[str]:
    """``package_dir``'s dependencies (plus the extras named as ``dir[extra,...]``)."""
    m = re.fullmatch(r"(.+?)(?:\[([^\]]+)\])?", package_dir)
    assert m is not None
    path, extras = m.group(1), [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
    project = tomllib.loads((Path(path) / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {})[extra]
    return [r for r in reqs if not (n := _NAME.match(r)) or not n.group(1).lower()
            .replace("_", "-").startswith("glowlm")]


def main(argv: list[str]) -> int:
    seen: dict[str, None] = {}
    for package_dir in argv:
        seen.update(dict.fromkeys(requirements(package_dir)))
    print("\n".join(seen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
