import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

# The suite's models are tiny: with more than one thread, OpenMP wake-ups cost more
# than the arithmetic (a 2x2x6x6 softmax took 20 ms on a busy 2-core machine).
torch.set_num_threads(1)
