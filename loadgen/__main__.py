"""``python -m loadgen``: the load generator without the ``llmq`` host CLI (for development)."""

from __future__ import annotations

import argparse
import sys

from loadgen.cli import add_arguments, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m loadgen", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
