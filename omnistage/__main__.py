import sys

from omnistage.cli import main

sys.exit(main())
