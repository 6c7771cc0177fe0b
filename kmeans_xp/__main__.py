import sys

from kmeans_xp.tools.cli import main

sys.exit(main())
