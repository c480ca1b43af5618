import sys

from llmq.cli import main

sys.exit(main())
