import sys

from harness.images.build import main

sys.exit(main())
