from kvblocks.llm_datadist.v2 import *
