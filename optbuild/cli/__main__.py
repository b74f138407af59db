import sys

from optbuild.cli import main

sys.exit(main())
