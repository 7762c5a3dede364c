"""The tool-use domain (SPEC sections 3.6, 4 "Tool use", 5): the base class generated tool
environments subclass (with the notices that bring the next instruction at the end of a tool
result), the sandbox's tool operations as typed records, and the tool-use episode.

``ToolUseBaseEnv`` itself lives in the sandbox runtime (``spade.envs.sandbox.runtime.tool_base``),
the only code that runs inside the sandbox; it is re-exported here for hand-written environments
and host-side tools.
"""

from ..sandbox.runtime.tool_base import (ALL_STEPS_COMPLETE_NOTICE, FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD,
                                         STEP_COMPLETE_NOTICE, ToolUseBaseEnv)
from .protocol import CriteriaResult, CriterionValue, Progress, ToolEnvInstance, ToolResult, ToolSchemas

__all__ = ["ALL_STEPS_COMPLETE_NOTICE", "FORMAT_ERROR_MESSAGE", "FORMAT_ERROR_REWARD", "STEP_COMPLETE_NOTICE",
           "ToolUseBaseEnv", "CriteriaResult", "CriterionValue",
           "Progress", "ToolEnvInstance", "ToolResult", "ToolSchemas"]
