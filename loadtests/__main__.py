import sys

from loadtests.sweep import main

sys.exit(main())
