"""DFlash drafter (:mod:`.model`) and its config parsing / validation against the target (:mod:`.config`)."""

from .config import (
    DFlashConfig,
    DrafterConfigError,
    DrafterConfigWarning,
    default_target_layer_ids,
    validate_drafter_config,
)
from .model import DFlashCache, DFlashDrafter

__all__ = [
    "DFlashCache",
    "DFlashConfig",
    "DFlashDrafter",
    "DrafterConfigError",
    "DrafterConfigWarning",
    "default_target_layer_ids",
    "validate_drafter_config",
]
