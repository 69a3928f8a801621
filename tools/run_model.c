#include "runtime/onnx.h"
int main(void) { return 1; }
