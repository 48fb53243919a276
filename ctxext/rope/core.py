"""Every public RoPE name in one import, for code written before the split (re-exports only, no logic).

The work lives in :mod:`ctxext.rope.read`, :mod:`ctxext.rope.scaling_types`, :mod:`ctxext.rope.plan` and
:mod:`ctxext.rope.runtime`; import from those.
"""

from ctxext.rope.methods import METHODS as METHODS
from ctxext.rope.methods import RopeMethod as RopeMethod
from ctxext.rope.methods import get_method as get_method
from ctxext.rope.methods import register_method as register_method
from ctxext.rope.methods.longrope import load_factors_file as load_factors_file
from ctxext.rope.plan import RELATIVE_TO as RELATIVE_TO
from ctxext.rope.plan import apply_plan as apply_plan
from ctxext.rope.plan import check_plan_intent as check_plan_intent
from ctxext.rope.plan import describe_extension as describe_extension
from ctxext.rope.plan import legacy_fields as legacy_fields
from ctxext.rope.plan import plan_extension as plan_extension
from ctxext.rope.read import normalize_rope_parameters as normalize_rope_parameters
from ctxext.rope.read import read_rope as read_rope
from ctxext.rope.read import text_config as text_config
from ctxext.rope.read import wavelengths as wavelengths
from ctxext.rope.runtime import RopeCheck as RopeCheck
from ctxext.rope.runtime import check_cos_sin as check_cos_sin
from ctxext.rope.runtime import check_model_rope as check_model_rope
from ctxext.rope.runtime import intent_problems as intent_problems
from ctxext.rope.runtime import patch_model as patch_model
from ctxext.rope.runtime import probe_lengths as probe_lengths
from ctxext.rope.runtime import probe_positions as probe_positions
from ctxext.rope.runtime import rebuild_rotary as rebuild_rotary
from ctxext.rope.runtime import reset_dynamic_rope as reset_dynamic_rope
from ctxext.rope.runtime import rotary_modules as rotary_modules
from ctxext.rope.runtime import runtime_model_from_config as runtime_model_from_config
from ctxext.rope.runtime import verify_against_plan as verify_against_plan
from ctxext.rope.runtime import verify_model_rope as verify_model_rope
from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES as LENGTH_DEPENDENT_TYPES
from ctxext.rope.scaling_types import SCALING_TYPES as SCALING_TYPES
from ctxext.rope.scaling_types import check_rope_parameters as check_rope_parameters
from ctxext.rope.scaling_types import reference_rope as reference_rope
from ctxext.rope.types import RopeConfigError as RopeConfigError
from ctxext.rope.types import RopeError as RopeError
from ctxext.rope.types import RopeMismatchError as RopeMismatchError
from ctxext.rope.types import RopePlan as RopePlan
from ctxext.rope.types import RopeState as RopeState
