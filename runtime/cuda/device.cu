/* device.cu: the GPU executor's core: what GPU the machine has, the device
 * (handles, stream, remembered algorithms), plans (memory laid out once,
 * constants uploaded once, the graph captured for replay), timing, and the
 * profiler that times one operator configuration. The kernels themselves
 * are the registry rows' eval_cuda, in the family files beside this one. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_int.h"

extern "C" {
#include "runtime/exec.h"
#include "runtime/plan.h"
}

/* ---- probe ---- */

extern "C" void cuda_probe(CudaInfo *info) {
  memset(info, 0, sizeof *info);
  info->built = true;
  info->cudnn_version = (int)cudnnGetVersion();
  cudaRuntimeGetVersion(&info->runtime_version);
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    snprintf(info->why, sizeof info->why, "no usable GPU: %s", cudaGetErrorString(rc));
    return;
  }
  if (n == 0) {
    snprintf(info->why, sizeof info->why, "no GPU found");
    return;
  }
  cudaDeviceProp prop;
  if ((rc = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    snprintf(info->why, sizeof info->why, "GPU 0 unreadable: %s", cudaGetErrorString(rc));
    return;
  }
  info->n_devices = n;
  snprintf(info->device, sizeof info->device, "%s", prop.name);
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->memory = prop.totalGlobalMem;
  info->sm_count = prop.multiProcessorCount;
  int clock_khz = 0, mem_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  /* 128 float32 lanes per multiprocessor from Volta on (64 before), two
   * flops per FMA; memory moves twice per clock. */
  int lanes = prop.major >= 7 ? 128 : 64;
  info->peak_gflops = 2.0 * lanes * info->sm_count * (clock_khz / 1e6);
  info->mem_gbps = 2.0 * (mem_khz / 1e6) * (bus_bits / 8.0);
}

/* ---- errors and notes ---- */

int cuda_fail(Diag *d, const char *file, int line, const char *call, const char *why) {
  const char *base = strrchr(file, '/');
  diag_error(d, "%s:%d: %s failed: %s", base ? base + 1 : file, line, call, why);
  return TEQ_ERR_INTERNAL;
}

int cuda_op_error(const Node *n, Diag *d, int rc, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  diag_error(d, "%s (GPU): %s", op_def(n->kind)->name, msg);
  return rc;
}

void cuda_note(CudaCtx *cx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cx->note, sizeof cx->note, fmt, ap);
  va_end(ap);
}

/* ---- the device ---- */

struct MemoEntry {
  uint64_t key;
  int64_t value[2];
};

struct CudaDevice {
  char name[256];
  cudaStream_t stream;
  cublasHandle_t cublas;
  cublasLtHandle_t cublaslt;
  cudnnHandle_t cudnn;
  void *cublas_workspace; /* cuBLAS's and cuBLASLt's: both run on the one stream, in turn */
  int sm_count;
  std::vector<MemoEntry> memo; /* few entries (one per conv configuration): a scan is enough */
  std::string pinned_way; /* empty: convolutions and products choose by timing */
};

/* ---- cuBLAS and cuBLASLt, loaded on first use (see cuda_int.h) ---- */

void *cuda_library_fn[CUDA_FN__COUNT];

static const char *const cublas_names[] = {
#define TEQ_FUNCTION_NAME(f) #f,
    TEQ_CUBLAS_FUNCTIONS(TEQ_FUNCTION_NAME)};
static const char *const cublaslt_names[] = {TEQ_CUBLASLT_FUNCTIONS(TEQ_FUNCTION_NAME)};
#undef TEQ_FUNCTION_NAME

#define TEQ_STR2(x) #x
#define TEQ_STR(x) TEQ_STR2(x)

static pthread_once_t libraries_once = PTHREAD_ONCE_INIT;
static char libraries_why[512]; /* empty once both loaded */

/* Opens soname (found as the linker would: the program's run path, then
 * the system's) and fills n entries of the table from `first` on. The
 * handle stays open for the life of the process. */
static bool load_library(const char *soname, const char *const *names, int n, int first) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(libraries_why, sizeof libraries_why, "cannot load %s: %s", soname, dlerror());
    return false;
  }
  for (int i = 0; i < n; i++) {
    cuda_library_fn[first + i] = dlsym(h, names[i]);
    if (!cuda_library_fn[first + i]) {
      snprintf(libraries_why, sizeof libraries_why, "%s has no function %s (a cuBLAS older "
               "than the headers Teq was built with?)", soname, names[i]);
      return false;
    }
  }
  return true;
}

static void load_libraries(void) {
  const int n_blas = (int)(sizeof cublas_names / sizeof *cublas_names);
  const int n_lt = (int)(sizeof cublaslt_names / sizeof *cublaslt_names);
  static_assert(sizeof cublas_names / sizeof *cublas_names +
                    sizeof cublaslt_names / sizeof *cublaslt_names == CUDA_FN__COUNT,
                "one name per table entry");
  if (load_library("libcublasLt.so." TEQ_STR(CUBLAS_VER_MAJOR), cublaslt_names, n_lt, n_blas) &&
      load_library("libcublas.so." TEQ_STR(CUBLAS_VER_MAJOR), cublas_names, n_blas, 0))
    libraries_why[0] = '\0';
}

extern "C" int cuda_libraries_load(Diag *d) {
  pthread_once(&libraries_once, load_libraries);
  if (!libraries_why[0]) return TEQ_OK;
  diag_error(d, "%s", libraries_why);
  return TEQ_ERR_UNSUPPORTED;
}

/* cuBLAS allocates nothing during a capture when it is given this much of
 * its own (its documentation's recommendation for Hopper). */
enum { CUBLAS_WORKSPACE_BYTES = 32 << 20 };

extern "C" int cuda_device_open(CudaDevice **out, Diag *d) {
  CudaInfo info;
  cuda_probe(&info);
  if (info.n_devices == 0) {
    diag_error(d, "%s", info.why);
    return TEQ_ERR_UNSUPPORTED;
  }
  int loaded = cuda_libraries_load(d);
  if (loaded != TEQ_OK) return loaded;
  CudaDevice *dev = new CudaDevice();
  snprintf(dev->name, sizeof dev->name, "%s", info.device);
  dev->sm_count = info.sm_count;
  int rc = TEQ_OK;
  auto fail = [&](int r) {
    cuda_device_close(dev);
    return r;
  };
#define OPEN_TRY(call, status_ok, why)                                            \
  do {                                                                            \
    auto s_ = (call);                                                             \
    if (s_ != (status_ok)) return fail(cuda_fail(d, __FILE__, __LINE__, #call, why(s_))); \
  } while (0)
  OPEN_TRY(cudaSetDevice(0), cudaSuccess, cudaGetErrorString);
  OPEN_TRY(cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking), cudaSuccess,
           cudaGetErrorString);
  OPEN_TRY(cublasCreate(&dev->cublas), CUBLAS_STATUS_SUCCESS, cublasGetStatusString);
  OPEN_TRY(cublasSetStream(dev->cublas, dev->stream), CUBLAS_STATUS_SUCCESS,
           cublasGetStatusString);
  /* Plain float32 arithmetic: no TF32 tensor cores, whatever the
   * environment says, so results agree with the CPU executor. */
  OPEN_TRY(cublasSetMathMode(dev->cublas, CUBLAS_PEDANTIC_MATH), CUBLAS_STATUS_SUCCESS,
           cublasGetStatusString);
  OPEN_TRY(cudaMalloc(&dev->cublas_workspace, CUBLAS_WORKSPACE_BYTES), cudaSuccess,
           cudaGetErrorString);
  OPEN_TRY(cublasSetWorkspace(dev->cublas, dev->cublas_workspace, CUBLAS_WORKSPACE_BYTES),
           CUBLAS_STATUS_SUCCESS, cublasGetStatusString);
  OPEN_TRY(cublasLtCreate(&dev->cublaslt), CUBLAS_STATUS_SUCCESS, cublasGetStatusString);
  OPEN_TRY(cudnnCreate(&dev->cudnn), CUDNN_STATUS_SUCCESS, cudnnGetErrorString);
  OPEN_TRY(cudnnSetStream(dev->cudnn, dev->stream), CUDNN_STATUS_SUCCESS, cudnnGetErrorString);
#undef OPEN_TRY
  *out = dev;
  return rc;
}

extern "C" void cuda_device_close(CudaDevice *dev) {
  if (!dev) return;
  if (dev->cudnn) cudnnDestroy(dev->cudnn);
  if (dev->cublas) cublasDestroy(dev->cublas);
  if (dev->cublaslt) cublasLtDestroy(dev->cublaslt);
  if (dev->cublas_workspace) cudaFree(dev->cublas_workspace);
  if (dev->stream) cudaStreamDestroy(dev->stream);
  delete dev;
}

extern "C" const char *cuda_device_name(const CudaDevice *dev) { return dev->name; }

extern "C" void cuda_device_pin_way(CudaDevice *dev, const char *way) {
  dev->pinned_way = way ? way : "";
  dev->memo.clear(); /* what was chosen by timing must be chosen again, pinned */
}

const char *cuda_pinned_way(CudaCtx *cx) {
  return cx->dev->pinned_way.empty() ? nullptr : cx->dev->pinned_way.c_str();
}

int cuda_sm_count(CudaCtx *cx) { return cx->dev->sm_count; }

bool cuda_split_applies(CudaCtx *cx, int64_t batch, int64_t rows, int64_t cols, int64_t k,
                        int s) {
  enum { MIN_K = 64, TILE = 128 };
  const size_t parts_cap = (size_t)64 << 20;
  int64_t tiles = batch * ((rows + TILE - 1) / TILE) * ((cols + TILE - 1) / TILE);
  int64_t sms = cx->dev->sm_count;
  return s > 1 && k % s == 0 && k / s >= MIN_K && tiles < sms && tiles * s <= 4 * sms &&
         (size_t)(s * batch * rows * cols) * sizeof(float) <= parts_cap;
}

int cuda_pinned_index(const Node *n, const char *pin, const char (*names)[CUDA_WAY_NAME_MAX],
                      int n_names, int *index, Diag *d) {
  std::string offered;
  for (int i = 0; i < n_names; i++) {
    if (strcmp(names[i], pin) == 0) {
      *index = i;
      return TEQ_OK;
    }
    offered += (i ? ", " : "") + std::string(names[i]);
  }
  return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                       "the pinned way \"%s\" is not offered here (offered: %s)", pin,
                       offered.c_str());
}

bool cuda_memo_get(CudaCtx *cx, uint64_t key, int64_t value[2]) {
  for (const MemoEntry &e : cx->dev->memo)
    if (e.key == key) {
      value[0] = e.value[0];
      value[1] = e.value[1];
      return true;
    }
  return false;
}

void cuda_memo_put(CudaCtx *cx, uint64_t key, const int64_t value[2]) {
  for (MemoEntry &e : cx->dev->memo)
    if (e.key == key) {
      e.value[0] = value[0];
      e.value[1] = value[1];
      return;
    }
  cx->dev->memo.push_back(MemoEntry{key, {value[0], value[1]}});
}

/* ---- plans ---- */

struct Step {
  int node;
  std::vector<CudaTensor> in, out;
  char note[96];
  /* The exit of a chain gathered (plan_gathers): where its rows come from,
   * in device memory; else rows NULL. */
  const float *const *rows = nullptr;
  int64_t n_rows = 0, row_len = 0;
  bool rows_aligned16 = false;
};

/* A buffer a kernel derived from a constant (cuda_derived). */
struct Derived {
  const void *of;
  int tag;
  size_t bytes;
  void *data;
};

struct CudaPlan {
  CudaDevice *dev;
  Graph *g;                       /* the plan's own copy (constants shared) */
  std::vector<Step> steps;
  std::vector<CudaTensor> values; /* by value slot: offset[node] + output */
  std::vector<int32_t> offset;
  std::vector<int> input_slot, output_slot;
  void *arena = nullptr, *consts = nullptr, *scratch = nullptr;
  size_t arena_bytes = 0, const_bytes = 0, scratch_bytes = 0;
  cudaGraphExec_t exec = nullptr;
  int exec_repeat = 0;            /* how many passes the captured graph makes */
  std::vector<Derived> derived;   /* what kernels derived from constants, kept */
  std::vector<int64_t> strides;   /* by value slot, TEQ_MAX_DIMS each: what strided values' point at */
  CudaCtx cx;
};

void *cuda_scratch(CudaCtx *cx, size_t bytes, Diag *d) {
  CudaPlan *p = cx->plan;
  if (bytes <= p->scratch_bytes) return p->scratch;
  if (cx->capturing) {
    diag_error(d, "scratch of %zu bytes asked for while capturing (first run sized %zu)", bytes,
               p->scratch_bytes);
    return nullptr;
  }
  /* Kernels already queued may still use the old buffer. */
  cudaError_t e = cudaStreamSynchronize(cx->stream);
  if (e == cudaSuccess && p->scratch) e = cudaFree(p->scratch);
  p->scratch = nullptr;
  p->scratch_bytes = 0;
  size_t want = std::max(bytes, (size_t)1 << 20);
  if (e == cudaSuccess) e = cudaMalloc(&p->scratch, want);
  if (e != cudaSuccess) {
    cuda_fail(d, __FILE__, __LINE__, "cudaMalloc(scratch)", cudaGetErrorString(e));
    return nullptr;
  }
  p->scratch_bytes = want;
  return p->scratch;
}

bool cuda_is_constant(CudaCtx *cx, const void *ptr) {
  const CudaPlan *p = cx->plan;
  const char *c = (const char *)ptr, *base = (const char *)p->consts;
  return base && c >= base && c < base + p->const_bytes;
}

void *cuda_derived(CudaCtx *cx, const void *of, int tag, size_t bytes, bool *fresh) {
  *fresh = false;
  return cuda_is_constant(cx, of) ? cuda_plan_kept(cx, of, tag, bytes, fresh) : nullptr;
}

void *cuda_plan_kept(CudaCtx *cx, const void *of, int tag, size_t bytes, bool *fresh) {
  CudaPlan *p = cx->plan;
  *fresh = false;
  for (const Derived &k : p->derived)
    if (k.of == of && k.tag == tag && k.bytes == bytes) return k.data;
  void *data = nullptr;
  if (cx->capturing) return nullptr;
  if (cudaMalloc(&data, std::max(bytes, (size_t)256)) != cudaSuccess) {
    (void)cudaGetLastError(); /* not sticky: the caller derives into scratch */
    return nullptr;
  }
  p->derived.push_back(Derived{of, tag, bytes, data});
  *fresh = true;
  return data;
}

void cuda_derived_drop(CudaCtx *cx, const void *of, int tag, size_t bytes) {
  CudaPlan *p = cx->plan;
  for (size_t i = 0; i < p->derived.size(); i++) {
    Derived &k = p->derived[i];
    if (k.of != of || k.tag != tag || k.bytes != bytes) continue;
    (void)cudaStreamSynchronize(cx->stream); /* work queued may still read it */
    cudaFree(k.data);
    p->derived.erase(p->derived.begin() + (long)i);
    return;
  }
}



static int upload(CudaPlan *p, const Tensor *t, void *dst, Diag *d) {
  CUDA_TRY(cudaMemcpyAsync(dst, t->data, tensor_bytes(t), cudaMemcpyHostToDevice, p->cx.stream));
  return TEQ_OK;
}

/* Runs every step once on the stream (the first run or inside a capture);
 * with `after`, records after[i] on the stream once step i is launched. */
static int run_steps(CudaPlan *p, Diag *d, cudaEvent_t *after = nullptr) {
  for (size_t i = 0; i < p->steps.size(); i++) {
    Step &s = p->steps[i];
    const Node *n = &p->g->nodes[s.node];
    p->cx.note[0] = '\0';
    int rc = s.rows ? cuda_gather_rows(&p->cx, s.rows, s.n_rows, s.row_len, s.rows_aligned16,
                                       (float *)s.out[0].data, d)
                    : op_def(n->kind)->eval_cuda(n, &p->cx, s.in.data(), s.out.data(), d);
    if (rc != TEQ_OK) {
      char label[GRAPH_LABEL_MAX];
      graph_node_label(p->g, s.node, label, sizeof label);
      diag_error(d, "node %s failed on the GPU", label);
      return rc;
    }
    if (!p->cx.capturing) snprintf(s.note, sizeof s.note, "%s", p->cx.note);
    if (after) CUDA_TRY(cudaEventRecord(after[i], p->cx.stream));
  }
  return TEQ_OK;
}

/* The median of v (sorted here); 0 when empty. */
static double median_of(std::vector<double> &v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

/* Captures `repeat` passes over the steps as one CUDA graph. */
static int capture(CudaPlan *p, int repeat, Diag *d) {
  if (p->exec) cudaGraphExecDestroy(p->exec);
  p->exec = nullptr;
  cudaGraph_t graph = nullptr;
  CUDA_TRY(cudaStreamBeginCapture(p->cx.stream, cudaStreamCaptureModeThreadLocal));
  p->cx.capturing = true;
  int rc = TEQ_OK;
  for (int r = 0; r < repeat && rc == TEQ_OK; r++) rc = run_steps(p, d);
  p->cx.capturing = false;
  cudaError_t e = cudaStreamEndCapture(p->cx.stream, &graph);
  if (rc != TEQ_OK) {
    if (graph) cudaGraphDestroy(graph);
    return rc;
  }
  if (e != cudaSuccess) return cuda_fail(d, __FILE__, __LINE__, "cudaStreamEndCapture", cudaGetErrorString(e));
  e = cudaGraphInstantiate(&p->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return cuda_fail(d, __FILE__, __LINE__, "cudaGraphInstantiate", cudaGetErrorString(e));
  p->exec_repeat = repeat;
  return TEQ_OK;
}

static int fill_random_inputs(CudaPlan *p, Diag *d) {
  for (size_t i = 0; i < p->input_slot.size(); i++) {
    const CudaTensor &v = p->values[p->input_slot[i]];
    Tensor *t = tensor_new(v.dtype, &v.shape);
    if (!t) return diag_error(d, "out of memory");
    tensor_fill_random(t, 0x5eed + i);
    int rc = upload(p, t, v.data, d);
    CUDA_TRY(cudaStreamSynchronize(p->cx.stream));
    tensor_unref(t);
    if (rc) return rc;
  }
  return TEQ_OK;
}

/* The plan's memory as mem_plan_build lays it out (runtime/plan.h): the
 * arena and the constants' block allocated, constants and sources' tensors
 * uploaded, every value's pointer set, each step's node checked for a
 * kernel. */
static int plan_memory(CudaPlan *p, const MemPlan &mp, Diag *d) {
  const Graph *g = p->g;
  p->offset.assign(mp.offset, mp.offset + g->n_nodes + 1);
  p->values.assign(mp.n_slots + 1, CudaTensor{nullptr, Shape{}, DT_F32});
  for (int id = 0; id < g->n_nodes; id++) {
    const Node *n = &g->nodes[id];
    for (int j = 0; j < n->n_out; j++) {
      int s = mp.offset[id] + j;
      if (mp.where[s] == MEM_UNUSED) continue;
      p->values[s].shape = n->out[j];
      p->values[s].dtype = n->dtype == DT_I64 ? DT_I64 : DT_F32;
    }
  }
  for (int i = 0; i < mp.n_steps; i++) {
    const Node *n = &g->nodes[mp.steps[i]];
    if (op_def(n->kind)->eval_cuda || mp.gathers.role[mp.steps[i]] == GATHER_EXIT) continue;
    char label[GRAPH_LABEL_MAX];
    graph_node_label(g, mp.steps[i], label, sizeof label);
    diag_error(d, "node %s: %s has no GPU kernel", label,
               n->opaque ? "an opaque operator" : "the operator");
    return TEQ_ERR_UNSUPPORTED;
  }
  p->input_slot.assign(mp.inputs, mp.inputs + mp.n_inputs);
  p->output_slot.assign(mp.outputs, mp.outputs + mp.n_outputs);
  for (int i = 0; i < mp.n_steps; i++) {
    Step st;
    st.node = mp.steps[i];
    st.note[0] = '\0';
    p->steps.push_back(st);
  }
  p->arena_bytes = (size_t)mp.arena_bytes;
  p->const_bytes = (size_t)mp.const_bytes;
  CUDA_TRY(cudaMalloc(&p->arena, std::max(p->arena_bytes, (size_t)256)));
  if (p->const_bytes) CUDA_TRY(cudaMalloc(&p->consts, p->const_bytes));
  /* The host tensors stay until their queued copies are done. */
  std::vector<Tensor *> host;
  int rc = TEQ_OK;
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++) {
    int s = mp.offset[id];
    if (g->nodes[id].n_out < 1 || mp.where[s] != MEM_CONST) continue;
    const Node *n = &g->nodes[id];
    p->values[s].data = (char *)p->consts + mp.at[s];
    Tensor *t = n->kind == OP_CONST ? tensor_ref(n->value) : tensor_new(DT_F32, &n->out[0]);
    if (!t) {
      rc = diag_error(d, "out of memory");
      break;
    }
    host.push_back(t);
    if (n->kind != OP_CONST) { /* a constant tensor (C_pool, I_conv...): computed once, here */
      Tensor *outs[1] = {t};
      if (op_def(n->kind)->eval_f32(n, nullptr, outs, d) != TEQ_OK) {
        char label[GRAPH_LABEL_MAX];
        graph_node_label(g, id, label, sizeof label);
        rc = diag_error(d, "node %s failed", label);
        break;
      }
    }
    rc = upload(p, t, p->values[s].data, d);
  }
  cudaError_t e = cudaStreamSynchronize(p->cx.stream);
  for (Tensor *t : host) tensor_unref(t);
  if (rc) return rc;
  if (e != cudaSuccess) return cuda_fail(d, __FILE__, __LINE__, "cudaStreamSynchronize", cudaGetErrorString(e));
  for (int s = 0; s < mp.n_slots; s++)
    if (mp.where[s] == MEM_ARENA) p->values[s].data = (char *)p->arena + mp.at[s];
  for (int s = 0; s < mp.n_slots; s++)
    if (mp.where[s] == MEM_ALIAS) p->values[s].data = (char *)p->values[mp.root[s]].data + mp.at[s];
  /* Each chain's rows, uploaded once: pointers into the arena and the
   * constants, which hold while the plan lives. */
  std::vector<const void *> slot_at(mp.n_slots + 1, nullptr);
  for (int s = 0; s < mp.n_slots; s++) slot_at[s] = p->values[s].data;
  for (Step &st : p->steps) {
    if (mp.gathers.role[st.node] != GATHER_EXIT) continue;
    const GatherRows *r = &mp.gathers.exits[mp.gathers.exit[st.node]];
    std::vector<const float *> rows(r->n_rows);
    plan_gather_pointers(r, slot_at.data(), rows.data());
    bool fresh = false;
    size_t bytes = rows.size() * sizeof rows[0];
    void *dev_rows = cuda_plan_kept(&p->cx, &g->nodes[st.node], CUDA_KEPT_ROWS, bytes, &fresh);
    if (!dev_rows) return diag_error(d, "out of GPU memory for a gather's %zu bytes of rows", bytes);
    CUDA_TRY(cudaMemcpy(dev_rows, rows.data(), bytes, cudaMemcpyHostToDevice));
    st.rows = (const float *const *)dev_rows;
    st.n_rows = r->n_rows, st.row_len = r->row_len;
    st.rows_aligned16 = true;
    for (const float *q : rows) st.rows_aligned16 = st.rows_aligned16 && ((uintptr_t)q & 15) == 0;
  }
  p->strides.assign(mp.strides, mp.strides + (size_t)mp.n_slots * TEQ_MAX_DIMS);
  for (int s = 0; s < mp.n_slots; s++)
    if (mp.strided[s]) p->values[s].strides = p->strides.data() + (size_t)s * TEQ_MAX_DIMS;
  /* A strided value goes only to kernels that read or write it so
   * (graph_strided asked them); anything else is the planner's mistake,
   * not the model's. */
  for (int i = 0; i < mp.n_steps; i++) {
    const Node *n = &g->nodes[mp.steps[i]];
    const OpDef *def = op_def(n->kind);
    Shape in[8];
    for (int j = 0; j < n->n_in && j < 8; j++) in[j] = *graph_shape(g, n->in[j]);
    for (int j = 0; j < n->n_in; j++) {
      int s = mp.offset[n->in[j].node] + n->in[j].out;
      if (!mp.strided[s]) continue;
      if (n->n_in <= 8 && def->reads_strided &&
          def->reads_strided(n, in, j, p->values[s].strides))
        continue;
      char label[GRAPH_LABEL_MAX];
      graph_node_label(g, mp.steps[i], label, sizeof label);
      diag_error(d, "node %s: planned to read input %d by strides, which it cannot", label, j);
      return TEQ_ERR_INTERNAL;
    }
    for (int j = 0; j < n->n_out; j++) {
      int s = mp.offset[mp.steps[i]] + j;
      if (!mp.strided[s]) continue;
      if (j == 0 && n->n_in <= 8 && def->writes_strided &&
          def->writes_strided(n, in, p->values[s].strides))
        continue;
      char label[GRAPH_LABEL_MAX];
      graph_node_label(g, mp.steps[i], label, sizeof label);
      diag_error(d, "node %s: planned to write output %d by strides, which it cannot", label, j);
      return TEQ_ERR_INTERNAL;
    }
  }
  return TEQ_OK;
}

static int plan_build(CudaPlan *p, const Graph *g0, Diag *d) {
  Graph *g = p->g = graph_copy(g0);
  if (!g) return diag_error(d, "out of memory copying the graph");
  MemPlan mp;
  int rc = mem_plan_build(g, &mp, d);
  if (rc != TEQ_OK) return rc;
  rc = plan_memory(p, mp, d);
  std::vector<char> is_input(mp.n_slots + 1, 0);
  for (int i = 0; i < mp.n_inputs; i++) is_input[mp.inputs[i]] = 1;
  std::vector<std::pair<int, size_t>> fill; /* the arena's computed values and their sizes */
  for (int s = 0; s < mp.n_slots; s++)
    if (mp.where[s] == MEM_ARENA && !is_input[s])
      fill.push_back({s, (size_t)std::max(mp.bytes[s], (int64_t)4)});
  mem_plan_fini(&mp);
  if (rc) return rc;

  /* Each step's tensors, resolved once. */
  for (Step &s : p->steps) {
    const Node *n = &g->nodes[s.node];
    for (int j = 0; j < n->n_in; j++)
      s.in.push_back(p->values[p->offset[n->in[j].node] + n->in[j].out]);
    for (int j = 0; j < n->n_out; j++) s.out.push_back(p->values[p->offset[s.node] + j]);
  }

  /* First run, outside any capture: kernels choose algorithms and size
   * scratch. Every byte of the arena starts as NaN (all ones), so an
   * output element a kernel skips shows up. */
  if ((rc = fill_random_inputs(p, d)) != TEQ_OK) return rc;
  for (const auto &v : fill)
    CUDA_TRY(cudaMemsetAsync(p->values[v.first].data, 0xff, v.second, p->cx.stream));
  if ((rc = run_steps(p, d)) != TEQ_OK) return rc;
  CUDA_TRY(cudaStreamSynchronize(p->cx.stream));
  return capture(p, 1, d);
}

extern "C" int cuda_plan_new(CudaDevice *dev, const Graph *g, CudaPlan **out, Diag *d) {
  CudaPlan *p = new CudaPlan();
  p->dev = dev;
  memset(&p->cx, 0, sizeof p->cx);
  p->cx.stream = dev->stream;
  p->cx.cublas = dev->cublas;
  p->cx.cublaslt = dev->cublaslt;
  p->cx.lt_workspace = dev->cublas_workspace;
  p->cx.lt_workspace_bytes = CUBLAS_WORKSPACE_BYTES;
  p->cx.cudnn = dev->cudnn;
  p->cx.dev = dev;
  p->cx.plan = p;
  int rc = plan_build(p, g, d);
  if (rc != TEQ_OK) {
    /* Leave the stream usable for the next plan. */
    cudaStreamSynchronize(dev->stream);
    cudaGetLastError();
    cuda_plan_free(p);
    return rc;
  }
  *out = p;
  return TEQ_OK;
}

extern "C" void cuda_plan_free(CudaPlan *p) {
  if (!p) return;
  if (p->exec) cudaGraphExecDestroy(p->exec);
  cudaFree(p->arena);
  cudaFree(p->consts);
  cudaFree(p->scratch);
  for (const Derived &k : p->derived) cudaFree(k.data);
  graph_free(p->g);
  delete p;
}

extern "C" int cuda_plan_run(CudaPlan *p, Tensor *const *inputs, Tensor **outputs, Diag *d) {
  cudaStream_t st = p->cx.stream;
  for (size_t i = 0; i < p->input_slot.size(); i++) {
    const CudaTensor &v = p->values[p->input_slot[i]];
    const Tensor *t = inputs[i];
    char a[SHAPE_STR_MAX], b[SHAPE_STR_MAX];
    if (!t || !shape_equal(&t->shape, &v.shape) || t->dtype != v.dtype)
      return diag_error(d, "GPU input %zu: expected %s %s, got %s", i, dtype_name(v.dtype),
                        shape_format(&v.shape, a, sizeof a),
                        t ? shape_format(&t->shape, b, sizeof b) : "nothing");
    CUDA_TRY(cudaMemcpyAsync(v.data, t->data, tensor_bytes(t), cudaMemcpyHostToDevice, st));
  }
  if (p->exec_repeat != 1) {
    int rc = capture(p, 1, d);
    if (rc) return rc;
  }
  CUDA_TRY(cudaGraphLaunch(p->exec, st));
  std::vector<Tensor *> got;
  for (int slot : p->output_slot) {
    const CudaTensor &v = p->values[slot];
    Tensor *t = tensor_new_uninit(v.dtype, &v.shape);
    if (!t) {
      for (Tensor *x : got) tensor_unref(x);
      return diag_error(d, "out of memory");
    }
    got.push_back(t);
    cudaError_t e = cudaMemcpyAsync(t->data, v.data, tensor_bytes(t), cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess) {
      for (Tensor *x : got) tensor_unref(x);
      return cuda_fail(d, __FILE__, __LINE__, "cudaMemcpyAsync", cudaGetErrorString(e));
    }
  }
  cudaError_t e = cudaStreamSynchronize(st);
  if (e != cudaSuccess) {
    for (Tensor *x : got) tensor_unref(x);
    return cuda_fail(d, __FILE__, __LINE__, "cudaStreamSynchronize", cudaGetErrorString(e));
  }
  for (size_t j = 0; j < got.size(); j++) outputs[j] = got[j];
  return TEQ_OK;
}

/* Replays the captured graph: warmup times, then repeats times between two
 * events each; per-pass times are divided by the passes captured. */
static int time_replays(CudaPlan *p, int warmup, int repeats, CudaTiming *t, Diag *d) {
  cudaStream_t st = p->cx.stream;
  cudaEvent_t start, stop;
  CUDA_TRY(cudaEventCreate(&start));
  CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> ms;
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < warmup && e == cudaSuccess; i++) e = cudaGraphLaunch(p->exec, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  for (int i = 0; i < repeats && e == cudaSuccess; i++) {
    float x = 0;
    e = cudaEventRecord(start, st);
    if (e == cudaSuccess) e = cudaGraphLaunch(p->exec, st);
    if (e == cudaSuccess) e = cudaEventRecord(stop, st);
    if (e == cudaSuccess) e = cudaEventSynchronize(stop);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&x, start, stop);
    ms.push_back((double)x / p->exec_repeat);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (e != cudaSuccess) return cuda_fail(d, __FILE__, __LINE__, "timing", cudaGetErrorString(e));
  double sum = 0;
  for (double x : ms) sum += x;
  t->repeats = (int)ms.size();
  t->median_ms = median_of(ms);
  t->min_ms = ms.empty() ? 0 : ms.front();
  t->mean_ms = ms.empty() ? 0 : sum / ms.size();
  return TEQ_OK;
}

extern "C" int cuda_plan_time(CudaPlan *p, int warmup, int repeats, CudaTiming *t, Diag *d) {
  if (repeats < 1) return diag_error(d, "cuda_plan_time: repeats must be at least 1");
  if (p->exec_repeat != 1) {
    int rc = capture(p, 1, d);
    if (rc) return rc;
  }
  return time_replays(p, warmup, repeats, t, d);
}

extern "C" size_t cuda_plan_device_bytes(const CudaPlan *p) {
  size_t derived = 0;
  for (const Derived &k : p->derived) derived += k.bytes;
  return p->arena_bytes + p->const_bytes + p->scratch_bytes + derived;
}

extern "C" int cuda_plan_n_steps(const CudaPlan *p) { return (int)p->steps.size(); }

extern "C" const char *cuda_plan_step_note(const CudaPlan *p, int step, int *node_id) {
  if (node_id) *node_id = p->steps[step].node;
  return p->steps[step].note;
}

/* Keeps the GPU busy for `ns` nanoseconds of its global timer. Launched
 * before timed steps, it lets the host queue every step before the first
 * starts, so that no step's time includes the host launching it: on the
 * H200, VGG-19's first two convs (cuDNN's fused call, tens of microseconds
 * of host work each) read 101.7 and 205.4 us in a run against 20.1 and
 * 120.8 alone, and the GPU had simply waited for the host. */
__global__ void hold_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
}

extern "C" int cuda_plan_time_steps(CudaPlan *p, int repeats, double *us, Diag *d) {
  if (repeats < 1) return diag_error(d, "cuda_plan_time_steps: repeats must be at least 1");
  size_t n = p->steps.size();
  std::vector<cudaEvent_t> ev(n + 1, nullptr);
  std::vector<std::vector<double>> ms(n);
  int rc = TEQ_OK;
  cudaError_t e = cudaSuccess;
  for (size_t i = 0; i <= n && e == cudaSuccess; i++) e = cudaEventCreate(&ev[i]);
  if (e == cudaSuccess) rc = run_steps(p, d); /* warm-up */
  /* 1 ms, and 100 us of host work per step, at most 100 ms. */
  unsigned long long hold_ns = std::min<unsigned long long>(100000000ull, 1000000ull + 100000ull * n);
  for (int r = 0; r < repeats && rc == TEQ_OK && e == cudaSuccess; r++) {
    hold_kernel<<<1, 1, 0, p->cx.stream>>>(hold_ns);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaEventRecord(ev[0], p->cx.stream);
    if (e == cudaSuccess) rc = run_steps(p, d, ev.data() + 1);
    if (rc == TEQ_OK && e == cudaSuccess) e = cudaEventSynchronize(ev[n]);
    for (size_t i = 0; i < n && rc == TEQ_OK && e == cudaSuccess; i++) {
      float x = 0;
      e = cudaEventElapsedTime(&x, ev[i], ev[i + 1]);
      ms[i].push_back(x);
    }
  }
  for (cudaEvent_t x : ev)
    if (x) cudaEventDestroy(x);
  if (rc != TEQ_OK) return rc;
  if (e != cudaSuccess) return cuda_fail(d, __FILE__, __LINE__, "timing steps", cudaGetErrorString(e));
  for (size_t i = 0; i < n; i++) us[i] = 1000.0 * median_of(ms[i]);
  return TEQ_OK;
}

/* ---- profiler ---- */

/* Passes over the node captured in one graph when it is timed: one launch
 * per pass would time the launch, not the kernel, for small operators; in a
 * whole-graph replay kernels follow each other as they do here. */
enum { PROFILE_PASSES = 20 };

extern "C" int cuda_profile_node(CudaDevice *dev, const Graph *g, int id, int repeats,
                                 CudaProfile *out, Diag *d) {
  memset(out, 0, sizeof *out);
  if (id < 0 || id >= g->n_nodes) return diag_error(d, "cuda_profile_node: no node %d", id);
  const Node *n = &g->nodes[id];
  Graph *one = graph_new();
  if (!one) return diag_error(d, "out of memory");
  std::vector<TensorRef> refs;
  int rc = TEQ_OK;
  for (int j = 0; j < n->n_in && rc >= 0; j++) {
    const Node *src = &g->nodes[n->in[j].node];
    char name[24];
    snprintf(name, sizeof name, "x%d", j);
    const Shape *shape = graph_shape(g, n->in[j]);
    if (src->kind == OP_CONST && src->value->data) {
      rc = graph_add_const(one, name, tensor_ref(src->value), d);
    } else if ((op_def(n->kind)->weight_inputs >> j & 1 || src->kind == OP_CONST) &&
               src->dtype != DT_I64) {
      /* A weight, held as a model's plan holds it; also one that optimize
       * prices without computing it (tensor_new_unbacked). */
      Tensor *t = tensor_new_uninit(DT_F32, shape);
      if (t) tensor_fill_random(t, 0x5eed + (uint64_t)j);
      rc = t ? graph_add_const(one, name, t, d) : diag_error(d, "out of memory");
    } else {
      rc = graph_add_input(one, name, shape, src->dtype == DT_I64 ? DT_I64 : DT_F32, d);
    }
    refs.push_back(TensorRef{rc, 0});
  }
  int node = rc >= 0 ? graph_add_node(one, n->kind, refs.data(), n->n_in, n->n_out, &n->params, n->name, d) : rc;
  for (int j = 0; node >= 0 && j < n->n_out && rc >= 0; j++)
    rc = graph_add_output(one, TensorRef{node, j}, nullptr, d);
  CudaPlan *p = nullptr;
  if (node < 0 || rc < 0) rc = node < 0 ? node : rc;
  else rc = cuda_plan_new(dev, one, &p, d);
  if (rc == TEQ_OK && p->steps.empty()) rc = diag_error(d, "cuda_profile_node: node %d runs no kernel", id);
  if (rc == TEQ_OK) rc = capture(p, PROFILE_PASSES, d);
  CudaTiming t;
  if (rc == TEQ_OK) rc = time_replays(p, 3, repeats, &t, d);
  if (rc == TEQ_OK) {
    out->median_us = t.median_ms * 1000.0;
    out->min_us = t.min_ms * 1000.0;
    out->repeats = t.repeats;
    snprintf(out->algo, sizeof out->algo, "%s", p->steps[0].note);
  }
  cuda_plan_free(p);
  graph_free(one);
  return rc;
}

/* ---- identity (runtime/ops/source.c): a copy on the stream ---- */

extern "C" int cuda_eval_identity(CUDA_KERNEL_SIGNATURE) {
  (void)n;
  size_t bytes = (size_t)shape_numel(&in[0].shape) * (in[0].dtype == DT_I64 ? 8 : 4);
  if (bytes) CUDA_TRY(cudaMemcpyAsync(out[0].data, in[0].data, bytes, cudaMemcpyDeviceToDevice, cx->stream));
  return TEQ_OK;
}

/* ---- the kernels' arithmetic on the host ---- */

extern "C" int cuda_kernel_on_host(const char *way, const Node *n, Tensor *const *in,
                                   Tensor *out, Diag *d) {
  const char *name = op_def(n->kind)->name;
  if (in[0]->dtype != DT_F32 || out->dtype != DT_F32) {
    diag_error(d, "%s: the host checks take float32", name);
    return TEQ_ERR_UNSUPPORTED;
  }
  if (n->kind == OP_CONV2D) return cuda_conv2d_on_host(way, n, in, out, d);
  if (n->kind == OP_GEMM) return cuda_gemm_on_host(way, n, in, out, d);
  if ((n->kind == OP_MAXPOOL || n->kind == OP_AVGPOOL) && !way)
    return cuda_pool_on_host(n, in, out, d);
  diag_error(d, "%s: no host check of its GPU kernel%s%s", name, way ? " way " : "",
             way ? way : "");
  return TEQ_ERR_UNSUPPORTED;
}
