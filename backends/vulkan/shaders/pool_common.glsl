// Push constants of the pooling shaders.
layout(push_constant) uniform PC {
  uint n_planes;  // N * C
  uint H, W, P, Q;
  uint kh, kw, sh, sw, ph, pw;
  uint is_max, has_ws;
  uint off_x, off_y, off_ws, off_dx;
  float scale;  // avg: 1 / (kh * kw)
} pc;
