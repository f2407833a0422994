"""`python -m launch.eval`: see launch/eval/command.py."""
import sys

from launch.eval.command import main

sys.exit(main())
