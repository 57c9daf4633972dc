from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    BOOL: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
INT32: DType
INT64: DType
FLOAT16: DType
FLOAT64: DType
BOOL: DType

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "total_bytes", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    total_bytes: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class AttrValue(_message.Message):
    __slots__ = ("i", "f", "s", "b", "ints", "floats", "tensor")
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    INTS_FIELD_NUMBER: _ClassVar[int]
    FLOATS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    i: int
    f: float
    s: str
    b: bool
    ints: IntList
    floats: FloatList
    tensor: Tensor
    def __init__(self, i: _Optional[int] = ..., f: _Optional[float] = ..., s: _Optional[str] = ..., b: _Optional[bool] = ..., ints: _Optional[_Union[IntList, _Mapping]] = ..., floats: _Optional[_Union[FloatList, _Mapping]] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class IntList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class FloatList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class Param(_message.Message):
    __slots__ = ("role", "variable", "shape", "dtype", "frozen", "regularizers", "update", "variable_shape", "view", "scalar_variable")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    VARIABLE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    REGULARIZERS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    VARIABLE_SHAPE_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    SCALAR_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    role: str
    variable: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    frozen: bool
    regularizers: _containers.RepeatedCompositeFieldContainer[Regularizer]
    update: str
    variable_shape: _containers.RepeatedScalarFieldContainer[int]
    view: Tensor
    scalar_variable: bool
    def __init__(self, role: _Optional[str] = ..., variable: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., frozen: _Optional[bool] = ..., regularizers: _Optional[_Iterable[_Union[Regularizer, _Mapping]]] = ..., update: _Optional[str] = ..., variable_shape: _Optional[_Iterable[int]] = ..., view: _Optional[_Union[Tensor, _Mapping]] = ..., scalar_variable: _Optional[bool] = ...) -> None: ...

class Regularizer(_message.Message):
    __slots__ = ("kind", "scale", "unreported")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    UNREPORTED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    scale: float
    unreported: bool
    def __init__(self, kind: _Optional[str] = ..., scale: _Optional[float] = ..., unreported: _Optional[bool] = ...) -> None: ...

class GradientTransform(_message.Message):
    __slots__ = ("kind", "value", "low", "high", "variables", "program")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    kind: str
    value: float
    low: float
    high: float
    variables: _containers.RepeatedScalarFieldContainer[str]
    program: WeightProgram
    def __init__(self, kind: _Optional[str] = ..., value: _Optional[float] = ..., low: _Optional[float] = ..., high: _Optional[float] = ..., variables: _Optional[_Iterable[str]] = ..., program: _Optional[_Union[WeightProgram, _Mapping]] = ...) -> None: ...

class DynamicLossScale(_message.Message):
    __slots__ = ("scale_variable", "good_steps_variable", "increment_period", "multiplier", "half_seed")
    SCALE_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    GOOD_STEPS_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    INCREMENT_PERIOD_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    HALF_SEED_FIELD_NUMBER: _ClassVar[int]
    scale_variable: str
    good_steps_variable: str
    increment_period: int
    multiplier: float
    half_seed: bool
    def __init__(self, scale_variable: _Optional[str] = ..., good_steps_variable: _Optional[str] = ..., increment_period: _Optional[int] = ..., multiplier: _Optional[float] = ..., half_seed: _Optional[bool] = ...) -> None: ...

class CS1DynamicLossScale(_message.Message):
    __slots__ = ("scale_variable", "steps_variable", "overflows_variable", "increment_period", "min_scale", "max_scale", "overflow_tolerance", "half_seed")
    SCALE_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    STEPS_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    OVERFLOWS_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    INCREMENT_PERIOD_FIELD_NUMBER: _ClassVar[int]
    MIN_SCALE_FIELD_NUMBER: _ClassVar[int]
    MAX_SCALE_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    HALF_SEED_FIELD_NUMBER: _ClassVar[int]
    scale_variable: str
    steps_variable: str
    overflows_variable: str
    increment_period: int
    min_scale: float
    max_scale: float
    overflow_tolerance: float
    half_seed: bool
    def __init__(self, scale_variable: _Optional[str] = ..., steps_variable: _Optional[str] = ..., overflows_variable: _Optional[str] = ..., increment_period: _Optional[int] = ..., min_scale: _Optional[float] = ..., max_scale: _Optional[float] = ..., overflow_tolerance: _Optional[float] = ..., half_seed: _Optional[bool] = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ("x", "y", "width", "height")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    width: int
    height: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("x", "y")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("src", "dst", "path", "bytes_per_sample", "replica", "bytes_per_batch")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    path: _containers.RepeatedCompositeFieldContainer[Point]
    bytes_per_sample: int
    replica: int
    bytes_per_batch: int
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., path: _Optional[_Iterable[_Union[Point, _Mapping]]] = ..., bytes_per_sample: _Optional[int] = ..., replica: _Optional[int] = ..., bytes_per_batch: _Optional[int] = ...) -> None: ...

class Kernel(_message.Message):
    __slots__ = ("name", "type", "inputs", "attrs", "params", "output_shape", "region", "source", "flops_per_sample", "samples_per_sec", "memory_per_core_bytes", "tf_tensor")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FLOPS_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PER_CORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TF_TENSOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    attrs: _containers.MessageMap[str, AttrValue]
    params: _containers.RepeatedCompositeFieldContainer[Param]
    output_shape: _containers.RepeatedScalarFieldContainer[int]
    region: Region
    source: str
    flops_per_sample: float
    samples_per_sec: float
    memory_per_core_bytes: int
    tf_tensor: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Mapping[str, AttrValue]] = ..., params: _Optional[_Iterable[_Union[Param, _Mapping]]] = ..., output_shape: _Optional[_Iterable[int]] = ..., region: _Optional[_Union[Region, _Mapping]] = ..., source: _Optional[str] = ..., flops_per_sample: _Optional[float] = ..., samples_per_sec: _Optional[float] = ..., memory_per_core_bytes: _Optional[int] = ..., tf_tensor: _Optional[str] = ...) -> None: ...

class Optimizer(_message.Message):
    __slots__ = ("type", "learning_rate", "momentum", "use_nesterov", "beta1", "beta2", "epsilon", "decay", "centered", "initial_accumulator_value", "weight_decay_rate", "use_bias_correction", "no_weight_decay", "one_minus_beta1", "one_minus_beta2", "l1", "l2", "l2_shrinkage", "lr_power", "scalar_names")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    USE_NESTEROV_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    CENTERED_FIELD_NUMBER: _ClassVar[int]
    INITIAL_ACCUMULATOR_VALUE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_RATE_FIELD_NUMBER: _ClassVar[int]
    USE_BIAS_CORRECTION_FIELD_NUMBER: _ClassVar[int]
    NO_WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    ONE_MINUS_BETA1_FIELD_NUMBER: _ClassVar[int]
    ONE_MINUS_BETA2_FIELD_NUMBER: _ClassVar[int]
    L1_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    L2_SHRINKAGE_FIELD_NUMBER: _ClassVar[int]
    LR_POWER_FIELD_NUMBER: _ClassVar[int]
    SCALAR_NAMES_FIELD_NUMBER: _ClassVar[int]
    type: str
    learning_rate: float
    momentum: float
    use_nesterov: bool
    beta1: float
    beta2: float
    epsilon: float
    decay: float
    centered: bool
    initial_accumulator_value: float
    weight_decay_rate: float
    use_bias_correction: bool
    no_weight_decay: _containers.RepeatedScalarFieldContainer[str]
    one_minus_beta1: float
    one_minus_beta2: float
    l1: float
    l2: float
    l2_shrinkage: float
    lr_power: float
    scalar_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, type: _Optional[str] = ..., learning_rate: _Optional[float] = ..., momentum: _Optional[float] = ..., use_nesterov: _Optional[bool] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., epsilon: _Optional[float] = ..., decay: _Optional[float] = ..., centered: _Optional[bool] = ..., initial_accumulator_value: _Optional[float] = ..., weight_decay_rate: _Optional[float] = ..., use_bias_correction: _Optional[bool] = ..., no_weight_decay: _Optional[_Iterable[str]] = ..., one_minus_beta1: _Optional[float] = ..., one_minus_beta2: _Optional[float] = ..., l1: _Optional[float] = ..., l2: _Optional[float] = ..., l2_shrinkage: _Optional[float] = ..., lr_power: _Optional[float] = ..., scalar_names: _Optional[_Iterable[str]] = ...) -> None: ...

class OptimizerGroup(_message.Message):
    __slots__ = ("optimizer", "variables")
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    optimizer: Optimizer
    variables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, optimizer: _Optional[_Union[Optimizer, _Mapping]] = ..., variables: _Optional[_Iterable[str]] = ...) -> None: ...

class Objective(_message.Message):
    __slots__ = ("loss_kernel", "variables")
    LOSS_KERNEL_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    loss_kernel: str
    variables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, loss_kernel: _Optional[str] = ..., variables: _Optional[_Iterable[str]] = ...) -> None: ...

class Reupdate(_message.Message):
    __slots__ = ("variable", "optimizer", "objective", "slots", "source")
    VARIABLE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    variable: str
    optimizer: int
    objective: int
    slots: _containers.RepeatedScalarFieldContainer[str]
    source: str
    def __init__(self, variable: _Optional[str] = ..., optimizer: _Optional[int] = ..., objective: _Optional[int] = ..., slots: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ...) -> None: ...

class ScalarOp(_message.Message):
    __slots__ = ("op", "dtype", "inputs", "controls", "value", "name")
    OP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    op: str
    dtype: str
    inputs: _containers.RepeatedScalarFieldContainer[int]
    controls: _containers.RepeatedScalarFieldContainer[int]
    value: float
    name: str
    def __init__(self, op: _Optional[str] = ..., dtype: _Optional[str] = ..., inputs: _Optional[_Iterable[int]] = ..., controls: _Optional[_Iterable[int]] = ..., value: _Optional[float] = ..., name: _Optional[str] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("hyper_parameter", "ops", "tf_tensor", "source", "optimizer")
    HYPER_PARAMETER_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    TF_TENSOR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    hyper_parameter: str
    ops: _containers.RepeatedCompositeFieldContainer[ScalarOp]
    tf_tensor: str
    source: str
    optimizer: int
    def __init__(self, hyper_parameter: _Optional[str] = ..., ops: _Optional[_Iterable[_Union[ScalarOp, _Mapping]]] = ..., tf_tensor: _Optional[str] = ..., source: _Optional[str] = ..., optimizer: _Optional[int] = ...) -> None: ...

class MovingAverage(_message.Message):
    __slots__ = ("variable", "shadow", "factor", "step_offset")
    VARIABLE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    STEP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    variable: str
    shadow: str
    factor: Schedule
    step_offset: int
    def __init__(self, variable: _Optional[str] = ..., shadow: _Optional[str] = ..., factor: _Optional[_Union[Schedule, _Mapping]] = ..., step_offset: _Optional[int] = ...) -> None: ...

class WriteStep(_message.Message):
    __slots__ = ("op", "inputs")
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, op: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ...) -> None: ...

class WeightWrite(_message.Message):
    __slots__ = ("variable", "steps", "factors", "before_update", "step_offset", "source", "sources", "predicate", "batch", "carried_dtype")
    VARIABLE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    FACTORS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    STEP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CARRIED_DTYPE_FIELD_NUMBER: _ClassVar[int]
    variable: str
    steps: _containers.RepeatedCompositeFieldContainer[WriteStep]
    factors: _containers.RepeatedCompositeFieldContainer[Schedule]
    before_update: bool
    step_offset: int
    source: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    predicate: Schedule
    batch: _containers.RepeatedScalarFieldContainer[str]
    carried_dtype: str
    def __init__(self, variable: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[WriteStep, _Mapping]]] = ..., factors: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., before_update: _Optional[bool] = ..., step_offset: _Optional[int] = ..., source: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ..., predicate: _Optional[_Union[Schedule, _Mapping]] = ..., batch: _Optional[_Iterable[str]] = ..., carried_dtype: _Optional[str] = ...) -> None: ...

class ConditionalUpdate(_message.Message):
    __slots__ = ("predicate", "variables", "accumulators", "source", "finite", "if_true", "if_false", "step_offset")
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATORS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FINITE_FIELD_NUMBER: _ClassVar[int]
    IF_TRUE_FIELD_NUMBER: _ClassVar[int]
    IF_FALSE_FIELD_NUMBER: _ClassVar[int]
    STEP_OFFSET_FIELD_NUMBER: _ClassVar[int]
    predicate: Schedule
    variables: _containers.RepeatedScalarFieldContainer[str]
    accumulators: _containers.RepeatedScalarFieldContainer[str]
    source: str
    finite: str
    if_true: _containers.RepeatedScalarFieldContainer[str]
    if_false: _containers.RepeatedScalarFieldContainer[str]
    step_offset: int
    def __init__(self, predicate: _Optional[_Union[Schedule, _Mapping]] = ..., variables: _Optional[_Iterable[str]] = ..., accumulators: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ..., finite: _Optional[str] = ..., if_true: _Optional[_Iterable[str]] = ..., if_false: _Optional[_Iterable[str]] = ..., step_offset: _Optional[int] = ...) -> None: ...

class Estimate(_message.Message):
    __slots__ = ("samples_per_sec", "compute_samples_per_sec", "transmission_samples_per_sec", "active_cores", "compute_utilization", "ideal_samples_per_sec", "pipeline_fill_seconds")
    SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    TRANSMISSION_SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CORES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    IDEAL_SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    samples_per_sec: float
    compute_samples_per_sec: float
    transmission_samples_per_sec: float
    active_cores: int
    compute_utilization: float
    ideal_samples_per_sec: float
    pipeline_fill_seconds: float
    def __init__(self, samples_per_sec: _Optional[float] = ..., compute_samples_per_sec: _Optional[float] = ..., transmission_samples_per_sec: _Optional[float] = ..., active_cores: _Optional[int] = ..., compute_utilization: _Optional[float] = ..., ideal_samples_per_sec: _Optional[float] = ..., pipeline_fill_seconds: _Optional[float] = ...) -> None: ...

class WeightProgram(_message.Message):
    __slots__ = ("sources", "kernels")
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[Param]
    kernels: _containers.RepeatedCompositeFieldContainer[Kernel]
    def __init__(self, sources: _Optional[_Iterable[_Union[Param, _Mapping]]] = ..., kernels: _Optional[_Iterable[_Union[Kernel, _Mapping]]] = ...) -> None: ...

class Program(_message.Message):
    __slots__ = ("name", "graph_hash", "fabric", "batch_size", "micro_batch_size", "inputs", "kernels", "loss_kernel", "reported_loss_kernel", "optimizer", "outputs", "routes", "estimate", "seed", "gradient_transforms", "num_replicas", "replica_offsets", "schedules", "moving_averages", "dynamic_loss_scale", "cs1_dynamic_loss_scale", "step_counts_applied", "weight_program", "weight_writes", "optimizer_groups", "objectives", "conditional_update", "reupdates")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRAPH_HASH_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    LOSS_KERNEL_FIELD_NUMBER: _ClassVar[int]
    REPORTED_LOSS_KERNEL_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_TRANSFORMS_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    MOVING_AVERAGES_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_LOSS_SCALE_FIELD_NUMBER: _ClassVar[int]
    CS1_DYNAMIC_LOSS_SCALE_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNTS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_PROGRAM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_WRITES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVES_FIELD_NUMBER: _ClassVar[int]
    CONDITIONAL_UPDATE_FIELD_NUMBER: _ClassVar[int]
    REUPDATES_FIELD_NUMBER: _ClassVar[int]
    name: str
    graph_hash: str
    fabric: str
    batch_size: int
    micro_batch_size: int
    inputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    kernels: _containers.RepeatedCompositeFieldContainer[Kernel]
    loss_kernel: str
    reported_loss_kernel: str
    optimizer: Optimizer
    outputs: _containers.RepeatedScalarFieldContainer[str]
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    estimate: Estimate
    seed: int
    gradient_transforms: _containers.RepeatedCompositeFieldContainer[GradientTransform]
    num_replicas: int
    replica_offsets: _containers.RepeatedCompositeFieldContainer[Point]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    moving_averages: _containers.RepeatedCompositeFieldContainer[MovingAverage]
    dynamic_loss_scale: DynamicLossScale
    cs1_dynamic_loss_scale: CS1DynamicLossScale
    step_counts_applied: bool
    weight_program: WeightProgram
    weight_writes: _containers.RepeatedCompositeFieldContainer[WeightWrite]
    optimizer_groups: _containers.RepeatedCompositeFieldContainer[OptimizerGroup]
    objectives: _containers.RepeatedCompositeFieldContainer[Objective]
    conditional_update: ConditionalUpdate
    reupdates: _containers.RepeatedCompositeFieldContainer[Reupdate]
    def __init__(self, name: _Optional[str] = ..., graph_hash: _Optional[str] = ..., fabric: _Optional[str] = ..., batch_size: _Optional[int] = ..., micro_batch_size: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., kernels: _Optional[_Iterable[_Union[Kernel, _Mapping]]] = ..., loss_kernel: _Optional[str] = ..., reported_loss_kernel: _Optional[str] = ..., optimizer: _Optional[_Union[Optimizer, _Mapping]] = ..., outputs: _Optional[_Iterable[str]] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., estimate: _Optional[_Union[Estimate, _Mapping]] = ..., seed: _Optional[int] = ..., gradient_transforms: _Optional[_Iterable[_Union[GradientTransform, _Mapping]]] = ..., num_replicas: _Optional[int] = ..., replica_offsets: _Optional[_Iterable[_Union[Point, _Mapping]]] = ..., schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., moving_averages: _Optional[_Iterable[_Union[MovingAverage, _Mapping]]] = ..., dynamic_loss_scale: _Optional[_Union[DynamicLossScale, _Mapping]] = ..., cs1_dynamic_loss_scale: _Optional[_Union[CS1DynamicLossScale, _Mapping]] = ..., step_counts_applied: _Optional[bool] = ..., weight_program: _Optional[_Union[WeightProgram, _Mapping]] = ..., weight_writes: _Optional[_Iterable[_Union[WeightWrite, _Mapping]]] = ..., optimizer_groups: _Optional[_Iterable[_Union[OptimizerGroup, _Mapping]]] = ..., objectives: _Optional[_Iterable[_Union[Objective, _Mapping]]] = ..., conditional_update: _Optional[_Union[ConditionalUpdate, _Mapping]] = ..., reupdates: _Optional[_Iterable[_Union[Reupdate, _Mapping]]] = ...) -> None: ...

class JobHeader(_message.Message):
    __slots__ = ("job_id", "token", "program", "num_workers", "global_step", "first_batch", "user")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    FIRST_BATCH_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token: str
    program: Program
    num_workers: int
    global_step: int
    first_batch: int
    user: str
    def __init__(self, job_id: _Optional[str] = ..., token: _Optional[str] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., num_workers: _Optional[int] = ..., global_step: _Optional[int] = ..., first_batch: _Optional[int] = ..., user: _Optional[str] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: JobHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[JobHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("job_id", "num_parameters", "estimate")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    num_parameters: int
    estimate: Estimate
    def __init__(self, job_id: _Optional[str] = ..., num_parameters: _Optional[int] = ..., estimate: _Optional[_Union[Estimate, _Mapping]] = ...) -> None: ...

class FeedRequest(_message.Message):
    __slots__ = ("token", "worker_id", "batch_index", "tensors", "end", "shared_input")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SHARED_INPUT_FIELD_NUMBER: _ClassVar[int]
    token: str
    worker_id: int
    batch_index: int
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    end: bool
    shared_input: SharedInput
    def __init__(self, token: _Optional[str] = ..., worker_id: _Optional[int] = ..., batch_index: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., end: _Optional[bool] = ..., shared_input: _Optional[_Union[SharedInput, _Mapping]] = ...) -> None: ...

class SharedInput(_message.Message):
    __slots__ = ("name", "slots")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    slots: int
    def __init__(self, name: _Optional[str] = ..., slots: _Optional[int] = ...) -> None: ...

class FeedReply(_message.Message):
    __slots__ = ("batches_received",)
    BATCHES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    batches_received: int
    def __init__(self, batches_received: _Optional[int] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("token", "steps", "output_steps")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_STEPS_FIELD_NUMBER: _ClassVar[int]
    token: str
    steps: int
    output_steps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token: _Optional[str] = ..., steps: _Optional[int] = ..., output_steps: _Optional[_Iterable[int]] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("sim_seconds", "sim_samples_per_sec", "wall_seconds", "input_wait_seconds")
    SIM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SIM_SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INPUT_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    sim_seconds: float
    sim_samples_per_sec: float
    wall_seconds: float
    input_wait_seconds: float
    def __init__(self, sim_seconds: _Optional[float] = ..., sim_samples_per_sec: _Optional[float] = ..., wall_seconds: _Optional[float] = ..., input_wait_seconds: _Optional[float] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step", "loss", "timing", "outputs", "global_step_variable")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_VARIABLE_FIELD_NUMBER: _ClassVar[int]
    step: int
    loss: float
    timing: StepTiming
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    global_step_variable: int
    def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ..., timing: _Optional[_Union[StepTiming, _Mapping]] = ..., outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., global_step_variable: _Optional[int] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("steps", "samples", "sim_seconds", "sim_samples_per_sec", "wall_seconds", "wall_samples_per_sec", "utilization", "input_wait_seconds")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SIM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SIM_SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WALL_SAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    INPUT_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    samples: int
    sim_seconds: float
    sim_samples_per_sec: float
    wall_seconds: float
    wall_samples_per_sec: float
    utilization: float
    input_wait_seconds: float
    def __init__(self, steps: _Optional[int] = ..., samples: _Optional[int] = ..., sim_seconds: _Optional[float] = ..., sim_samples_per_sec: _Optional[float] = ..., wall_seconds: _Optional[float] = ..., wall_samples_per_sec: _Optional[float] = ..., utilization: _Optional[float] = ..., input_wait_seconds: _Optional[float] = ...) -> None: ...

class RunResult(_message.Message):
    __slots__ = ("step", "summary")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    step: StepResult
    summary: JobSummary
    def __init__(self, step: _Optional[_Union[StepResult, _Mapping]] = ..., summary: _Optional[_Union[JobSummary, _Mapping]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("token", "chunk_bytes")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    token: str
    chunk_bytes: int
    def __init__(self, token: _Optional[str] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("state", "job_id", "global_step", "fabric", "message", "user", "since")
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    state: str
    job_id: str
    global_step: int
    fabric: str
    message: str
    user: str
    since: float
    def __init__(self, state: _Optional[str] = ..., job_id: _Optional[str] = ..., global_step: _Optional[int] = ..., fabric: _Optional[str] = ..., message: _Optional[str] = ..., user: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class LeaseBeat(_message.Message):
    __slots__ = ("global_step",)
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    global_step: int
    def __init__(self, global_step: _Optional[int] = ...) -> None: ...

class UnloadRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class UnloadReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
