"""Names of every environment variable the entrypoint reads or sets, in one place.

docs/ENVIRONMENT.md documents each one (who sets it, what it means). Only
``entrypoint.cluster.environments`` reads these from the process environment; the rest of the
package receives a ``ClusterTopology`` / ``Settings`` value or writes child environments.
"""

# --- Vertex AI / AI Platform -------------------------------------------------------------
CLUSTER_SPEC = "CLUSTER_SPEC"
TF_CONFIG = "TF_CONFIG"
AIP_MODEL_DIR = "AIP_MODEL_DIR"
AIP_CHECKPOINT_DIR = "AIP_CHECKPOINT_DIR"
AIP_TENSORBOARD_LOG_DIR = "AIP_TENSORBOARD_LOG_DIR"
CLOUD_ML_TRIAL_ID = "CLOUD_ML_TRIAL_ID"
CLOUD_ML_HP_METRIC_FILE = "CLOUD_ML_HP_METRIC_FILE"

# --- PyTorch (AI Platform node-level, torchrun, Kubeflow) ---------------------------------
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
NODE_RANK = "NODE_RANK"
NNODES = "NNODES"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
# The rest of what torchrun sets for each process (the in-process path sets the same set, with the same values).
ROLE_NAME = "ROLE_NAME"
ROLE_RANK = "ROLE_RANK"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TORCHELASTIC_SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
OMP_NUM_THREADS = "OMP_NUM_THREADS"  # torchrun: 1 per process when a node runs several, unless the user set it
MALLOC_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"  # glibc; the user's value wins over FSDP-on-CPU's mallopt
TRITON_CACHE_DIR = "TRITON_CACHE_DIR"  # Triton's kernel cache where the user moved it: kept in the job's compile cache
PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"

# --- Kubeflow Trainer's JAX runtime (one process per pod); jax.distributed reads the coordinator's address too --
JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
JAX_PROCESS_ID = "JAX_PROCESS_ID"
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_COORDINATOR_PORT = "JAX_COORDINATOR_PORT"

# --- MPI / Horovod ------------------------------------------------------------------------
OMPI_COMM_WORLD_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_COMM_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_COMM_WORLD_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_COMM_WORLD_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"
PMI_RANK = "PMI_RANK"
PMI_SIZE = "PMI_SIZE"
MPI_LOCALRANKID = "MPI_LOCALRANKID"
MPI_LOCALNRANKS = "MPI_LOCALNRANKS"
HOROVOD_RANK = "HOROVOD_RANK"
HOROVOD_SIZE = "HOROVOD_SIZE"
HOROVOD_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
HOROVOD_CROSS_RANK = "HOROVOD_CROSS_RANK"
HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_SIZE"
HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"
HOROVOD_CONTROLLER = "HOROVOD_CONTROLLER"
HOROVOD_CPU_OPERATIONS = "HOROVOD_CPU_OPERATIONS"
HOROVOD_GLOO_RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
HOROVOD_GLOO_RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"
HOROVOD_GLOO_TIMEOUT_SECONDS = "HOROVOD_GLOO_TIMEOUT_SECONDS"
HOROVOD_GLOO_IFACE = "HOROVOD_GLOO_IFACE"  # the Horovod launcher: "lo" when the chief's host is a loopback address
HOROVOD_FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"
HOROVOD_CYCLE_TIME = "HOROVOD_CYCLE_TIME"
HOROVOD_AUTOTUNE = "HOROVOD_AUTOTUNE"
HOROVOD_AUTOTUNE_LOG = "HOROVOD_AUTOTUNE_LOG"
HOROVOD_TUNING = (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_AUTOTUNE, HOROVOD_AUTOTUNE_LOG)

# --- TensorFlow ---------------------------------------------------------------------------
TF_USE_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"

# --- Ours: image defaults and what the parent hands its child processes --------------------
TRAINER_FRAMEWORK = "TRAINER_FRAMEWORK"
TRAINER_MODULE = "TRAINER_MODULE"
TRAINER_JOB_DIR = "TRAINER_JOB_DIR"
TRAINER_REPLICA = "TRAINER_REPLICA"
TRAINER_RESTART_COUNT = "TRAINER_RESTART_COUNT"  # how many times the platform restarted this replica (0 at first)
# When `local` started this run (wall clock, seconds): a failure record written before it is an earlier run's, even
# one written a moment ago (a job run again at once), never the cause of this one's failure.
TRAINER_RUN_STARTED = "TRAINER_RUN_STARTED"
# The CPUs this replica may use: `local` gives each emulated replica its share of the host's (a replica's own VM would
# have its own); a user may set it where a container is limited to fewer CPUs than the host shows. Each process then
# gets OMP_NUM_THREADS = TRAINER_CPUS / its node's processes (at least 1), unless the user set OMP_NUM_THREADS.
TRAINER_CPUS = "TRAINER_CPUS"
TRAINER_FORK_SERVER = "TRAINER_FORK_SERVER"  # 0/false/off: a node's ranks are exec'd, not forked from its fork server
TRAINER_PLAN_FILE = "TRAINER_PLAN_FILE"  # the plan the launcher hands its worker processes (a private file)
TRAINER_JOB_LEASE = "TRAINER_JOB_LEASE"  # the chief's job-dir lease token, for its processes' commit fence
TRAINER_ATTEMPT = "TRAINER_ATTEMPT"  # the node's attempt, under which its training processes write the job ledger
TRAINER_GOODPUT_JOB_NAME = "TRAINER_GOODPUT_JOB_NAME"  # ml-goodput-measurement's job name: the chief prints its entries
TRAINER_LOG_FORMAT = "TRAINER_LOG_FORMAT"  # default --log-format; the entrypoint sets the resolved one for children
TRAINER_IMAGE = "TRAINER_IMAGE"  # the image reference the job's spec ran (job vertex/kubeflow write it when pinned)
TRAINER_SBOM = "TRAINER_SBOM"  # where the image's bill of materials is (default /usr/share/trainer/sbom.cdx.json)
XDG_CACHE_HOME = "XDG_CACHE_HOME"  # `job --pin` of a local build reads images/local_build.py's records under it
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"  # set by the images, and by `local` for each replica (output as it happens)
TMPDIR = "TMPDIR"  # `local`: a private temporary directory per replica, as each Vertex replica is its own machine

# --- Platform facts read for failure reporting and logging ---------------------------------
KUBERNETES_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"  # set in every Kubernetes pod: /dev/termination-log applies
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch elastic's per-worker error file
TORCH_CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"
TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"

# --- JAX and Keras 3 ----------------------------------------------------------------------
KERAS_BACKEND = "KERAS_BACKEND"  # the JAX framework: jax (a user's other value is refused)

# --- Read by `doctor` and the start-up preflight ------------------------------------------
CUDA_VERSION = "CUDA_VERSION"  # set by the nvidia/cuda base images: the image's CUDA
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"  # the user's choice of network interface for NCCL
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"  # likewise for gloo (torch.distributed on CPU)

# --- The GPU fabric step (cluster/fabric.py, docs/fabric.md) -------------------------------
TRAINER_FABRIC = "TRAINER_FABRIC"  # the default --fabric: auto | off | gib | tcpxo | tcpx
TRAINER_FABRIC_ROOT = "TRAINER_FABRIC_ROOT"  # tests only: where the node's tree is mounted (default /)
TRAINER_FABRIC_APPLIED = "TRAINER_FABRIC_APPLIED"  # set when the entrypoint starts itself again with the step applied
LD_LIBRARY_PATH = "LD_LIBRARY_PATH"  # the fabric's plugin directory goes first, as the recipes set it
NCCL_LIB_DIR = "NCCL_LIB_DIR"  # TCPXO's plugin directory, which its profile reads
NCCL_NET = "NCCL_NET"  # gIB's profile sets gIB; a stray gIB on a node without it is removed
NCCL_NET_PLUGIN = "NCCL_NET_PLUGIN"
NCCL_TUNER_PLUGIN = "NCCL_TUNER_PLUGIN"
NCCL_TUNER_CONFIG_PATH = "NCCL_TUNER_CONFIG_PATH"
NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE = "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE"  # TCPXO's checker
NCCL_NVLSTREE_MAX_CHUNKSIZE = "NCCL_NVLSTREE_MAX_CHUNKSIZE"  # TCPXO's guest config checker aborts a job without it
NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY = "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"  # TCPXO: the aperture devices' directory
NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX = "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"  # TCPX: RxDM's socket directory

# --- Cloud Storage (read by storage.py; the Google libraries read their own) -------------------
STORAGE_EMULATOR_HOST = "STORAGE_EMULATOR_HOST"  # gcsfs's emulator setting: gs:// goes to that server, anonymously
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"  # set to false under the emulator
GOOGLE_APPLICATION_CREDENTIALS = "GOOGLE_APPLICATION_CREDENTIALS"  # ADC's key file (named in errors, never read by us)

# --- The platform's advance notice (read by settings.metadata_host; Google's libraries read it too) --------------
GCE_METADATA_HOST = "GCE_METADATA_HOST"  # host[:port] of the metadata server (default metadata.google.internal)

# --- Kubeflow Trainer's progress endpoint (its TrainJobStatus feature; outputs/goodput/kubeflow_progress.py) ------
KUBEFLOW_TRAINER_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"  # https URL the chief POSTs the TrainJob's progress to
KUBEFLOW_TRAINER_SERVER_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"  # path of the CA certificate (PEM) to verify by
KUBEFLOW_TRAINER_SERVER_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"  # path of the bearer token (a rotating projected JWT)

# --- Variables a framework sets a default for, where the user's own value wins -------------
# (each framework declares its own as ``Framework.user_variables``; ``read_settings`` reads what the user set)
FRAMEWORK_DEFAULTED = (OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING, *HOROVOD_TUNING, TF_USE_LEGACY_KERAS,
                       TF_CPP_MIN_LOG_LEVEL, KERAS_BACKEND)
