import sys

from sglang_spec.serving.cpu_server.cli import main

sys.exit(main())
