// Workgroup-wide sum of one value per invocation (256 invocations); every invocation gets the
// total. Uses red_a, so two reductions in a row need the barrier this function ends with.
shared float red_a[WG];

float workgroup_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  red_a[tid] = v;
  barrier();
  for (uint h = WG / 2; h > 0; h >>= 1) {
    if (tid < h) red_a[tid] += red_a[tid + h];
    barrier();
  }
  const float total = red_a[0];
  barrier();
  return total;
}
