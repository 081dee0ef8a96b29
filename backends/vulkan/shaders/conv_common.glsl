// Convolution dimensions in the GEMM push constants' shader-specific words.
#define CN pc.e[0]
#define CC pc.e[1]
#define CH pc.e[2]
#define CW pc.e[3]
#define CK pc.e[4]
#define CR pc.e[5]
#define CS pc.e[6]
#define CP pc.e[7]
#define CQ pc.e[8]
#define STRIDE_H pc.e[9]
#define STRIDE_W pc.e[10]
#define PAD_H pc.e[11]
#define PAD_W pc.e[12]

#ifdef CONV_X
// x(n, c, oh * stride - pad + r, ow * stride - pad + s), zero outside the image; the including
// shader names the image buffer CONV_X and its word offset CONV_X_OFF.
float load_x_window(uint n, uint ch, uint oh, uint ow, uint r, uint s) {
  const int ih = int(oh * STRIDE_H + r) - int(PAD_H);
  const int iw = int(ow * STRIDE_W + s) - int(PAD_W);
  if (ih < 0 || iw < 0 || ih >= int(CH) || iw >= int(CW)) return 0.0;
  return CONV_X[CONV_X_OFF + ((n * CC + ch) * CH + uint(ih)) * CW + uint(iw)];
}
#endif
