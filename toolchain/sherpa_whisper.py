"""Model code's first import path for sherpa-onnx's Whisper host loop, kept so model files need no edit:
toolchain.modelkit.sherpa_whisper (toolchain/deploy/sherpa_whisper.py)."""
from toolchain.deploy.sherpa_whisper import (
    EOT_EN,
    EOT_MULTI,
    LANGUAGE_0,
    MODEL_TYPES,
    SOT_EN,
    SOT_MULTI,
    Contract,
    ContractError,
    GraphRun,
    detokenize,
    parse_prefix,
    read_tokens,
    recognize,
)

__all__ = ["EOT_EN", "EOT_MULTI", "LANGUAGE_0", "MODEL_TYPES", "SOT_EN", "SOT_MULTI", "Contract", "ContractError",
           "GraphRun", "detokenize", "parse_prefix", "read_tokens", "recognize"]
