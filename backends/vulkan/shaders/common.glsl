// Shared definitions of the element-wise and reduction shaders: 256 invocations per workgroup
// and grid-stride loops, so one dispatch of at most 65535 workgroups covers any length.
#define WG 256
layout(local_size_x = WG) in;

uint grid_stride() {
  return gl_NumWorkGroups.x * WG;
}
