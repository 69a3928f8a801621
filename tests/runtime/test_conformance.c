#include "tests/check.h"
int main(void) { check_skip("not written yet"); }
