"""`python -m containers check|convert`: see containers/recipes.py."""
from __future__ import annotations

import sys
from pathlib import Path

from common.errors import ArgumentParser, CSRunError, cli_entry
from containers.recipes import DEFINITION, dockerfile_to_definition, missing_sources, read_definition

PROG = "python -m containers"


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description="Check or write Apptainer definition files.")
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="parse a definition file; check its %%files sources exist")
    check.add_argument("definition", nargs="?", type=Path, default=DEFINITION)
    check.add_argument("--root", type=Path, default=DEFINITION.parent.parent,
                       help="where `apptainer build` runs (default: the csrun sources)")
    convert = sub.add_parser("convert", help="write a Dockerfile as a definition file")
    convert.add_argument("dockerfile", type=Path)
    convert.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.action == "check":
        definition = read_definition(args.definition)
        missing = missing_sources(definition, args.root)
        if missing:
            raise CSRunError(f"{definition.path}: %files sources missing below {args.root}: "
                             f"{', '.join(missing)}", "build from the directory they are relative to (--root)")
        print(f"{definition.path}: from {definition.base_image}, {len(definition.files)} file "
              f"entries, {len(definition.post)} %post lines: ok")
        return 0
    text = dockerfile_to_definition(args.dockerfile)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
