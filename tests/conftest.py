import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# torch runs on one thread in the whole test run: see the conftest.py at the root.
