/* unary.cuh: the unary element-wise operators as device functors, whose
 * expressions are the CPU rows' (runtime/ops/elementwise.c), and act_eval,
 * a fused activation (ACT_*) through them. Shared by elementwise.cu, which
 * runs them as operators, and the epilogues of conv.cu and
 * cuda_sum_partials, which apply a fused activation in the pass that adds
 * a bias: one pass over the output where a bias pass and an activation
 * pass were two. */
#ifndef TEQ_CUDA_UNARY_CUH
#define TEQ_CUDA_UNARY_CUH

#include <math.h>

#include "runtime/ops.h"

/* Unary functors see the row's first two float parameters, as float32 like
 * the CPU's UNARY_LOOP reads them; act_eval also which fused activation
 * (ACT_*) they belong to (fused_act_args). */
struct UnaryArgs {
  float a0, a1;
  int act;
};

/* The functors act_eval reaches run on the host too: the host check of
 * the direct convolution kernel's arithmetic (cuda_conv2d_direct_on_host)
 * applies its epilogue through them. */
#define UNARY_FN __host__ __device__

/* a * b rounded once: on the device __fmul_rn keeps nvcc from fusing it
 * into an fma the CPU does not do; the host's compiler (no -mfma) does not
 * fuse. */
UNARY_FN __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/* The CPU's clamp: a NaN stays NaN. */
UNARY_FN __forceinline__ float clamp_f(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

UNARY_FN __forceinline__ float softplus_f(float x) {
  return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

/* The CPU clears every value whose sign bit is set: -0 and a negative NaN
 * become 0, a positive NaN stays. */
struct OpRelu {
  __device__ float operator()(float x, UnaryArgs) const {
    unsigned u = __float_as_uint(x);
    return __uint_as_float(u & ~(unsigned)((int)u >> 31));
  }
};
struct OpSigmoid {
  UNARY_FN float operator()(float x, UnaryArgs) const { return 1.0f / (1.0f + expf(-x)); }
};
/* x times OpSigmoid's sigmoid of x: the product the Sigmoid and Mul it
 * replaces compute. */
struct OpSilu {
  UNARY_FN float operator()(float x, UnaryArgs a) const { return x * OpSigmoid()(x, a); }
};
struct OpTanh {
  UNARY_FN float operator()(float x, UnaryArgs) const { return tanhf(x); }
};
struct OpExp {
  UNARY_FN float operator()(float x, UnaryArgs) const { return expf(x); }
};
struct OpLog {
  UNARY_FN float operator()(float x, UnaryArgs) const { return logf(x); }
};
struct OpSqrt {
  UNARY_FN float operator()(float x, UnaryArgs) const { return sqrtf(x); }
};
struct OpNeg {
  UNARY_FN float operator()(float x, UnaryArgs) const { return -x; }
};
struct OpAbs {
  UNARY_FN float operator()(float x, UnaryArgs) const { return fabsf(x); }
};
struct OpReciprocal {
  UNARY_FN float operator()(float x, UnaryArgs) const { return 1.0f / x; }
};
struct OpErf {
  UNARY_FN float operator()(float x, UnaryArgs) const { return erff(x); }
};
struct OpLeakyRelu {
  UNARY_FN float operator()(float x, UnaryArgs p) const { return x >= 0.0f ? x : p.a0 * x; }
};
struct OpElu {
  UNARY_FN float operator()(float x, UnaryArgs p) const {
    return x >= 0.0f ? x : p.a0 * expm1f(x);
  }
};
struct OpClip {
  UNARY_FN float operator()(float x, UnaryArgs p) const { return clamp_f(x, p.a0, p.a1); }
};
struct OpSoftplus {
  UNARY_FN float operator()(float x, UnaryArgs) const { return softplus_f(x); }
};
/* mul_rn: the CPU rounds the product before adding. */
struct OpHardSigmoid {
  UNARY_FN float operator()(float x, UnaryArgs p) const {
    return clamp_f(mul_rn(p.a0, x) + p.a1, 0.0f, 1.0f);
  }
};
struct OpSelu {
  UNARY_FN float operator()(float x, UnaryArgs p) const {
    return p.a1 * (x > 0.0f ? x : p.a0 * expm1f(x));
  }
};
struct OpThresholdedRelu {
  UNARY_FN float operator()(float x, UnaryArgs p) const { return x > p.a0 ? x : 0.0f; }
};
struct OpHardSwish {
  UNARY_FN float operator()(float x, UnaryArgs) const {
    return x * clamp_f(mul_rn(x, 1.0f / 6.0f) + 0.5f, 0.0f, 1.0f);
  }
};
struct OpCelu {
  UNARY_FN float operator()(float x, UnaryArgs p) const {
    return x > 0.0f ? x : p.a0 * expm1f(x / p.a0);
  }
};
struct OpMish {
  UNARY_FN float operator()(float x, UnaryArgs) const { return x * tanhf(softplus_f(x)); }
};

/* act_apply_f32's relu, which unlike the relu row maps NaN to 0. */
struct OpActRelu {
  UNARY_FN float operator()(float x, UnaryArgs) const { return x > 0 ? x : 0; }
};

/* Fused activation act (ACT_*) as the kernels take it: the registry's
 * parameters of its operator (act_op_params: a relu6's clip bounds, a hard
 * sigmoid's alpha and beta), read as the CPU reads them. Host side. */
static inline UnaryArgs fused_act_args(int act) {
  UnaryArgs a = {0.0f, 0.0f, act};
  if (act_op_kind(act) == OP__COUNT) return a;
  Params p;
  act_op_params(act, &p);
  a.a0 = (float)p.v[0].f, a.a1 = (float)p.v[1].f;
  return a;
}

/* Fused activation f (fused_act_args) of v: the operator act_op_kind
 * names, with its parameters. */
UNARY_FN __forceinline__ float act_eval(UnaryArgs f, float v) {
  switch (f.act) {
  case ACT_RELU: return OpActRelu()(v, f);
  case ACT_SIGMOID: return OpSigmoid()(v, f);
  case ACT_TANH: return OpTanh()(v, f);
  case ACT_SILU: return OpSilu()(v, f);
  case ACT_HARD_SWISH: return OpHardSwish()(v, f);
  case ACT_RELU6: return OpClip()(v, f);
  case ACT_HARD_SIGMOID:
  case ACT_HARD_SIGMOID_FIFTH: return OpHardSigmoid()(v, f);
  default: return v;
  }
}

/* A fused activation as an element-wise operator (cuda_act_apply). */
struct OpFusedAct {
  UNARY_FN float operator()(float x, UnaryArgs f) const { return act_eval(f, x); }
};

#endif
