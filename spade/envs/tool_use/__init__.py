"""The tool-use domain (SPEC sections 3.6, 4 "Tool use", 5): the base class generated tool
environments subclass, the sandbox's tool operations as typed records, and the tool-use episode.

``ToolUseBaseEnv`` itself lives in the sandbox runtime (``spade.envs.sandbox.runtime.tool_base``),
the only code that runs inside the sandbox; it is re-exported here for hand-written environments
and host-side tools.
"""

from ..sandbox.runtime.tool_base import FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD, ToolUseBaseEnv
from .protocol import CriteriaResult, CriterionValue, Progress, ToolEnvInstance, ToolResult, ToolSchemas

__all__ = ["FORMAT_ERROR_MESSAGE", "FORMAT_ERROR_REWARD", "ToolUseBaseEnv", "CriteriaResult", "CriterionValue",
           "Progress", "ToolEnvInstance", "ToolResult", "ToolSchemas"]
