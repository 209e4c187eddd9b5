// Does a weight stream read behind prefetchnta leave a smaller buffer in the L3? (docs/decode.md, stop 42)
// Reads buffer A (argv[1] MB) twice, streams 512 MB with plain loads, prefetchnta, prefetcht0 or vmovntdqa (or
// nothing), then times one more read of A: at L3 speed if the stream left A there.
//   gcc -O2 -march=native -o /tmp/l3keep scripts/l3_keep_probe.c && /tmp/l3keep 6
// Zen 5 guest (stop 42), A re-read after the stream, GB/s: 6 MB: none 132, nta 97-105, plain / t0 41-43;
// 12 MB: none 72-115, nta 37-74, plain / t0 28-38; 24 MB: none 59-65, nta 32-43, plain / t0 33-36.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static __m512i sink;
static void readbuf(const char*p,size_t n){__m512i a=_mm512_setzero_si512(),b=a;for(size_t i=0;i<n;i+=128){a=_mm512_add_epi32(a,_mm512_load_si512(p+i));b=_mm512_add_epi32(b,_mm512_load_si512(p+i+64));}sink=_mm512_add_epi32(sink,_mm512_add_epi32(a,b));}
static void stream(const char*p,size_t n,int mode){__m512i a=_mm512_setzero_si512(),b=a;const size_t D=4096;
 for(size_t i=0;i<n;i+=128){
  if(mode==1){_mm_prefetch(p+i+D,_MM_HINT_NTA);_mm_prefetch(p+i+D+64,_MM_HINT_NTA);}
  if(mode==2){_mm_prefetch(p+i+D,_MM_HINT_T0);_mm_prefetch(p+i+D+64,_MM_HINT_T0);}
  if(mode==3){a=_mm512_add_epi32(a,_mm512_stream_load_si512((void*)(p+i)));b=_mm512_add_epi32(b,_mm512_stream_load_si512((void*)(p+i+64)));continue;}
  a=_mm512_add_epi32(a,_mm512_load_si512(p+i));b=_mm512_add_epi32(b,_mm512_load_si512(p+i+64));}
 sink=_mm512_add_epi32(sink,_mm512_add_epi32(a,b));}
int main(int argc,char**argv){size_t A=(size_t)atoi(argv[1])<<20,W=(size_t)512<<20;
 char*a=aligned_alloc(4096,A),*w=aligned_alloc(4096,W);memset(a,1,A);memset(w,2,W);
 const char*names[]={"plain","nta","t0","streamload","none"};
 for(int r=0;r<3;r++)for(int mode=0;mode<5;mode++){
  readbuf(a,A);readbuf(a,A);
  double t0=now(); if(mode<4) stream(w,W,mode); double t1=now();
  readbuf(a,A); double t2=now();
  printf("%-10s stream %.1f GB/s, then A (%zu MB) %.1f GB/s\n",names[mode],W/(t1-t0+1e-12)/1e9*(mode<4),A>>20,A/(t2-t1)/1e9);}
 return 0;}
