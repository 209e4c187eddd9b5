"""python -m lowbit.formats --markdown | --update-readme README.md: the weight-format table."""
from __future__ import annotations

import argparse
import sys

from lowbit.formats import table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lowbit.formats", description=table.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--markdown", action="store_true", help="print the table as markdown")
    g.add_argument("--update-readme", metavar="README", help="rewrite the table between the markers in README")
    args = p.parse_args(argv)
    if args.markdown:
        print(table.markdown())
    else:
        changed = table.update_readme(args.update_readme)
        print(f"{args.update_readme}: {'updated' if changed else 'already up to date'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
