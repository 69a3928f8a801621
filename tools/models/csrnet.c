/* csrnet.c: CSRNet (Li, Zhang and Chen, CVPR 2018), the crowd-counting
 * network of the paper's configuration B: the first 10 conv layers of
 * VGG-16 with its 3 max pools as the front end, a back end of six 3x3
 * convs with dilation 2 (512, 512, 512, 256, 128, 64 channels), and a 1x1
 * conv to a one-channel density map. Input 1x3x224x224, output 1x1x28x28.
 *
 * Every conv has a bias and, except the last, a fused relu; "same" padding
 * (2 for the dilated ones) keeps the size. Weights use He's gain: there is
 * no normalization and no residual in 17 layers, and at gain 1 each relu
 * layer would divide the activations' mean square by 6. */
#include "tools/models/models.h"

/* VGG-16's first ten convs; 0 marks a 2x2/2 max pool. */
static const int front_end[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512};
static const int back_end[] = {512, 512, 512, 256, 128, 64};

static TensorRef conv3(Builder *b, TensorRef x, int64_t ch, int dilation) {
  ConvSpec c = {.out_ch = ch, .k = 3, .stride = 1, .dilation = dilation, .groups = 1,
                .act = ACT_RELU, .has_bias = true, .gain = BUILDER_GAIN_RELU};
  return builder_conv(b, x, &c);
}

int csrnet_build(Builder *b) {
  TensorRef x = builder_input(b, "image", shape_of(4, 1, 3, 224, 224));
  for (size_t i = 0; i < sizeof front_end / sizeof *front_end; i++)
    x = front_end[i] ? conv3(b, x, front_end[i], 1) : builder_pool(b, OP_MAXPOOL, x, 2, 2, 0);
  for (size_t i = 0; i < sizeof back_end / sizeof *back_end; i++)
    x = conv3(b, x, back_end[i], 2);
  ConvSpec out = {.out_ch = 1, .k = 1, .stride = 1, .dilation = 1, .groups = 1,
                  .act = ACT_NONE, .has_bias = true, .gain = 1.0};
  return builder_output(b, builder_conv(b, x, &out), "density");
}
