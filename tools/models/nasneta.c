/* nasneta.c: NasNet-A (Zoph et al., CVPR 2018) in its mobile size, with
 * the cells of TASO's examples/nasnet_a.py: input 1x3x224x224, a 3x3/2
 * stem conv, two reduction cells down to 28x28, then three stages of four
 * normal cells (44, 88, 176 filters per branch) joined by reduction cells,
 * global average pooling and a 1000-way linear classifier.
 *
 * A cell first maps both inputs to its branch width: `cur` by a 1x1 relu
 * conv and `prev` the same way, or by a 3x3/2 relu conv when it is twice
 * as large (it comes from before a reduction). Each branch pair is added
 * and the five sums are concatenated, so a cell outputs 5 x filters.
 * Separable convs are, as in TASO, a depthwise conv (groups = channels)
 * followed by a 1x1 conv, both without activation. Pooling is 3x3 with
 * "same" padding; average pooling excludes the padding. There are no
 * biases and no batch norm (TASO has neither).
 *
 * Wiring follows NasNet (prev is the cell before cur, across reductions);
 * TASO instead starts each stage with prev = cur = the reduction output and
 * has no stem, starting from a 1x128x56x56 input. */
#include "tools/models/models.h"

enum { STEM_CH = 32, FILTERS = 44, STAGES = 3, NORMAL_CELLS = 4, CLASSES = 1000 };

/* A 1x1 relu conv. Gain sqrt(3), not He's sqrt(6): it halves the mean
 * square, which cancels the doubling by the branch sums of the cell before,
 * so activations keep their scale through the 16 cells. */
static TensorRef squeeze(Builder *b, TensorRef x, int64_t ch) {
  ConvSpec c = {.out_ch = ch, .k = 1, .stride = 1, .dilation = 1, .groups = 1, .act = ACT_RELU,
                .gain = BUILDER_GAIN_LINEAR};
  return builder_conv(b, x, &c);
}

/* prev at cur's size and width. */
static TensorRef fit(Builder *b, TensorRef prev, TensorRef cur) {
  int64_t ch = builder_dim(b, cur, 1);
  if (builder_dim(b, prev, 2) == builder_dim(b, cur, 2)) return squeeze(b, prev, ch);
  ConvSpec c = {.out_ch = ch, .k = 3, .stride = 2, .dilation = 1, .groups = 1, .act = ACT_RELU,
                .gain = BUILDER_GAIN_LINEAR};
  return builder_conv(b, prev, &c);
}

static TensorRef sep_conv(Builder *b, TensorRef x, int k, int stride) {
  int64_t ch = builder_dim(b, x, 1);
  ConvSpec dw = {.out_ch = ch, .k = k, .stride = stride, .dilation = 1, .groups = (int)ch,
                 .act = ACT_NONE, .gain = BUILDER_GAIN_LINEAR};
  ConvSpec pw = {.out_ch = ch, .k = 1, .stride = 1, .dilation = 1, .groups = 1, .act = ACT_NONE,
                 .gain = BUILDER_GAIN_LINEAR};
  return builder_conv(b, builder_conv(b, x, &dw), &pw);
}

static TensorRef add(Builder *b, TensorRef x, TensorRef y) {
  return builder_binary(b, OP_EWADD, x, y);
}

static TensorRef normal_cell(Builder *b, TensorRef prev, TensorRef cur, int64_t ch) {
  cur = squeeze(b, cur, ch);
  prev = fit(b, prev, cur);
  TensorRef o[5];
  o[0] = add(b, sep_conv(b, cur, 3, 1), cur);
  o[1] = add(b, sep_conv(b, prev, 3, 1), sep_conv(b, cur, 3, 1));
  o[2] = add(b, builder_pool(b, OP_AVGPOOL, cur, 3, 1, 1), prev);
  o[3] = add(b, builder_pool(b, OP_AVGPOOL, prev, 3, 1, 1),
             builder_pool(b, OP_AVGPOOL, prev, 3, 1, 1));
  o[4] = add(b, sep_conv(b, prev, 3, 1), sep_conv(b, prev, 3, 1));
  return builder_concat(b, o, 5, 1);
}

static TensorRef reduction_cell(Builder *b, TensorRef prev, TensorRef cur, int64_t ch) {
  cur = squeeze(b, cur, ch);
  prev = fit(b, prev, cur);
  TensorRef o[5];
  o[0] = add(b, sep_conv(b, prev, 7, 2), sep_conv(b, cur, 5, 2));
  o[1] = add(b, builder_pool(b, OP_MAXPOOL, cur, 3, 2, 1), sep_conv(b, prev, 7, 2));
  o[2] = add(b, builder_pool(b, OP_AVGPOOL, cur, 3, 2, 1), sep_conv(b, prev, 5, 2));
  o[3] = add(b, builder_pool(b, OP_MAXPOOL, cur, 3, 2, 1), sep_conv(b, o[0], 3, 1));
  o[4] = add(b, builder_pool(b, OP_AVGPOOL, o[0], 3, 1, 1), o[1]);
  return builder_concat(b, o, 5, 1);
}

static TensorRef classifier(Builder *b, TensorRef x) {
  int64_t ch = builder_dim(b, x, 1);
  x = builder_node(b, OP_GLOBAL_AVGPOOL, &x, 1, NULL);
  x = builder_reshape(b, x, (const int64_t[]){1, ch}, 2);
  TensorRef in[3] = {x};
  in[1] = builder_weight(b, shape_of(2, (int)ch, CLASSES), ch);
  in[2] = builder_weight(b, shape_of(1, CLASSES), ch);
  return builder_node(b, OP_GEMM, in, 3, NULL);
}

int nasneta_build(Builder *b) {
  TensorRef x = builder_input(b, "image", shape_of(4, 1, 3, 224, 224));
  ConvSpec stem = {.out_ch = STEM_CH, .k = 3, .stride = 2, .dilation = 1, .groups = 1,
                   .act = ACT_RELU, .gain = BUILDER_GAIN_RELU};
  TensorRef prev = builder_conv(b, x, &stem);
  TensorRef cur = reduction_cell(b, prev, prev, FILTERS / 2);
  TensorRef next = reduction_cell(b, prev, cur, FILTERS);
  prev = cur;
  cur = next;
  for (int stage = 0; stage < STAGES; stage++) {
    int64_t ch = (int64_t)FILTERS << stage;
    for (int i = 0; i < NORMAL_CELLS * b->scale; i++) {
      next = normal_cell(b, prev, cur, ch);
      prev = cur;
      cur = next;
    }
    if (stage + 1 < STAGES) {
      next = reduction_cell(b, prev, cur, 2 * ch);
      prev = cur;
      cur = next;
    }
  }
  return builder_output(b, classifier(b, cur), "logits");
}
