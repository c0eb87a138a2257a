from kvblocks.llm_datadist.v2.llm_types import *
