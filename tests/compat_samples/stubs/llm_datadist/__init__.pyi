# Type-checking alias: under `python -m kvblocks.compat`, llm_datadist is kvblocks.llm_datadist.
from kvblocks.llm_datadist import *
