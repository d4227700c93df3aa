"""`python -m e2e.image` (`make image`): builds the image; its path is the last line printed.

Progress goes to stderr; stdout is the archive's path, digest and size, path last.
"""

from __future__ import annotations

import argparse
import sys

from e2e.image.build import build
from e2e.image.rootfs import ImageError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.image", description=__doc__)
    parser.add_argument("--refresh", action="store_true", help="remake the cached Debian tree (security updates)")
    args = parser.parse_args(argv)
    try:
        built = build(refresh=args.refresh)
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    print(f"digest\t{built.digest}")
    print(f"size\t{built.size}")
    print(built.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
