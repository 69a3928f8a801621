/* nasrnn.c: the NAS-RNN of TASO's evaluation (Zoph and Le, ICLR 2017, as
 * TASO's examples/nasrnn.py builds it): 5 time steps, hidden size 512,
 * batch 1, one graph input [1, 512] per step, the state carried from step
 * to step and the last state as the output.
 *
 * The cell is TASO's: eight candidates t_i = x W_i + h U_i, combined by a
 * fixed tree whose leaves apply relu, sigmoid or tanh:
 *   m0 = relu(t0) + sigmoid(t3)       m1 = sigmoid(t1) + tanh(t2)
 *   m2 = sigmoid(t4) * tanh(t5)       m3 = sigmoid(t6) * relu(t7)
 *   m4 = sigmoid(m1) + tanh(m2)       m5 = tanh(m0) * tanh(m3)
 *   h' = tanh(tanh(m4) * tanh(m5))
 * The eight x W_i of a step share x (and the h U_i share h), the pattern
 * TASO merges into one wide matmul.
 *
 * Unlike nasrnn.py, which draws fresh weights for every step, the 16
 * matrices are shared by all steps as in a real recurrent network: the
 * operator graph is the same, the file 5x smaller. The initial state is a
 * random constant, as in TASO, so the first step's h U_i are constant too
 * (Teq's importer folds them). */
#include <stdio.h>
#include <stdlib.h>

#include "tools/models/models.h"

enum { HIDDEN = 512, STEPS = 5, CANDIDATES = 8 };

typedef struct CellWeights {
  TensorRef w[CANDIDATES]; /* input to candidate */
  TensorRef u[CANDIDATES]; /* state to candidate */
} CellWeights;

/* Gain sqrt(3): candidates of the input's scale. The cell's output is
 * still small (rms about 0.06) since its tree multiplies values below 1
 * and m3's relu zeroes about half of h'; that is the cell, not the scale. */
static void make_weights(Builder *b, CellWeights *cw) {
  Shape s = shape_of(2, HIDDEN, HIDDEN);
  for (int i = 0; i < CANDIDATES; i++) {
    cw->w[i] = builder_weight_gain(b, s, HIDDEN, BUILDER_GAIN_LINEAR);
    cw->u[i] = builder_weight_gain(b, s, HIDDEN, BUILDER_GAIN_LINEAR);
  }
}

static TensorRef op1(Builder *b, OpKind kind, TensorRef x) { return builder_unary(b, kind, x); }

static TensorRef cell(Builder *b, const CellWeights *cw, TensorRef x, TensorRef h) {
  TensorRef t[CANDIDATES];
  for (int i = 0; i < CANDIDATES; i++)
    t[i] = builder_binary(b, OP_EWADD, builder_binary(b, OP_MATMUL, x, cw->w[i]),
                          builder_binary(b, OP_MATMUL, h, cw->u[i]));
  TensorRef m0 = builder_binary(b, OP_EWADD, op1(b, OP_RELU, t[0]), op1(b, OP_SIGMOID, t[3]));
  TensorRef m1 = builder_binary(b, OP_EWADD, op1(b, OP_SIGMOID, t[1]), op1(b, OP_TANH, t[2]));
  TensorRef m2 = builder_binary(b, OP_EWMUL, op1(b, OP_SIGMOID, t[4]), op1(b, OP_TANH, t[5]));
  TensorRef m3 = builder_binary(b, OP_EWMUL, op1(b, OP_SIGMOID, t[6]), op1(b, OP_RELU, t[7]));
  TensorRef m4 = builder_binary(b, OP_EWADD, op1(b, OP_SIGMOID, m1), op1(b, OP_TANH, m2));
  TensorRef m5 = builder_binary(b, OP_EWMUL, op1(b, OP_TANH, m0), op1(b, OP_TANH, m3));
  TensorRef m6 = builder_binary(b, OP_EWMUL, op1(b, OP_TANH, m4), op1(b, OP_TANH, m5));
  return op1(b, OP_TANH, m6);
}

int nasrnn_build(Builder *b) {
  int steps = STEPS * b->scale;
  TensorRef *x = calloc((size_t)steps, sizeof *x);
  if (!x) return TEQ_ERR_NOMEM;
  for (int s = 0; s < steps; s++) {
    char name[16];
    snprintf(name, sizeof name, "x%d", s);
    x[s] = builder_input(b, name, shape_of(2, 1, HIDDEN));
  }
  CellWeights cw;
  make_weights(b, &cw);
  TensorRef h = builder_weight(b, shape_of(2, 1, HIDDEN), 1); /* uniform in [-1, 1) */
  for (int s = 0; s < steps; s++) h = cell(b, &cw, x[s], h);
  free(x);
  return builder_output(b, h, "state");
}
