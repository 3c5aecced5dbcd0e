// Two processes (CPU 0 and CPU 1) ping-pong 64-byte messages over a Unix stream socket pair,
// each side spinning for the next message in one of two ways (MODE): 0, poll(2) with a zero
// timeout then recv; 1, recv with MSG_DONTWAIT. Prints the p50 and p90 of COUNT round trips.
//   gcc -O2 -o stream-poll-ways stream-poll-ways.c && ./stream-poll-ways MODE COUNT
#define _GNU_SOURCE
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/wait.h>
static long ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000L+t.tv_nsec;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static int mode;
static ssize_t rx(int fd,char*b){
  for(;;){
    if(mode==0){struct pollfd p={fd,POLLIN,0}; if(poll(&p,1,0)>0) return recv(fd,b,64,0);}
    else {ssize_t n=recv(fd,b,64,MSG_DONTWAIT); if(n>0) return n;}
    __builtin_ia32_pause();
  }
}
static int cmp(const void*a,const void*b){long x=*(long*)a,y=*(long*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  mode=atoi(argv[1]); int n=atoi(argv[2]); int sv[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sv);
  char buf[64]; memset(buf,1,64);
  if(fork()==0){pin(1); for(int i=0;i<n;i++){ssize_t k=rx(sv[1],buf); send(sv[1],buf,k,0);} _exit(0);}
  pin(0); long *t=malloc(n*sizeof(long));
  for(int i=0;i<n;i++){long s=ns(); send(sv[0],buf,64,0); rx(sv[0],buf); t[i]=ns()-s;}
  wait(NULL); qsort(t,n,sizeof(long),cmp);
  printf("mode %d p50 %.2f p90 %.2f us\n",mode,t[n/2]/1e3,t[n*9/10]/1e3);
}
