"""`python -m launch.ablate`: see launch/ablate/command.py."""
import sys

from launch.ablate.command import main

sys.exit(main())
