// Push constants of the direct grouped-convolution shaders (gconv_*): x (N,C,H,W), w (K,C/G,R,S),
// y (N,K,P,Q), G groups; output channel k reads the input channels of group k / (K/G).
layout(push_constant) uniform PC {
  uint N, C, H, W, K, R, S, P, Q;
  uint sh, sw, ph, pw, G;
  uint off0, off1, off2, off_b;  // word offsets into bindings 0, 1, 2 and the bias (binding 3)
  uint has_bias;
} pc;
