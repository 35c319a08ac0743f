import sys

from sglang_spec.patching import main

sys.exit(main())
