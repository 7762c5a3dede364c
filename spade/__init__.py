"""spade: self-play with environments the model designs (docs/ and README.md)."""

from . import deferred_imports

deferred_imports.install()
