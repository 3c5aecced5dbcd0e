// Two processes (CPU 0 and CPU 1) ping-pong 64-byte messages over two POSIX message queues, each
// side spinning for the next message in one of three ways (MODE): 0, poll(2) with a zero timeout
// then mq_receive; 1, mq_timedreceive with a deadline in the past on a blocking descriptor;
// 2, mq_receive on an O_NONBLOCK descriptor. Prints the p50 and p90 of COUNT round trips.
//   gcc -O2 -o queue-poll-ways queue-poll-ways.c -lrt && ./queue-poll-ways MODE COUNT
#define _GNU_SOURCE
#include <mqueue.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
static long ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000L+t.tv_nsec;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static int mode;
static ssize_t rx(mqd_t q,char*b){
  for(;;){
    if(mode==0){struct pollfd p={q,POLLIN,0}; if(poll(&p,1,0)>0) return mq_receive(q,b,8192,NULL);}
    else if(mode==1){struct timespec past={0,0}; ssize_t n=mq_timedreceive(q,b,8192,NULL,&past); if(n>=0) return n;}
    else {ssize_t n=mq_receive(q,b,8192,NULL); if(n>=0) return n;}
    __builtin_ia32_pause();
  }
}
static int cmp(const void*a,const void*b){long x=*(long*)a,y=*(long*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  mode=atoi(argv[1]); int n=atoi(argv[2]);
  struct mq_attr a={0};a.mq_maxmsg=10;a.mq_msgsize=8192;
  int nb = mode==2?O_NONBLOCK:0;
  mq_unlink("/mqx.a");mq_unlink("/mqx.b");
  mqd_t A=mq_open("/mqx.a",O_RDWR|O_CREAT|nb,0600,&a), B=mq_open("/mqx.b",O_RDWR|O_CREAT|nb,0600,&a);
  char buf[8192]; memset(buf,1,64);
  if(fork()==0){pin(1); for(int i=0;i<n;i++){ssize_t k=rx(A,buf); mq_send(B,buf,k,0);} _exit(0);}
  pin(0); long *t=malloc(n*sizeof(long));
  for(int i=0;i<n;i++){long s=ns(); mq_send(A,buf,64,0); rx(B,buf); t[i]=ns()-s;}
  wait(NULL); qsort(t,n,sizeof(long),cmp);
  printf("mode %d p50 %.2f p90 %.2f us\n",mode,t[n/2]/1e3,t[n*9/10]/1e3);
  mq_unlink("/mqx.a");mq_unlink("/mqx.b");
}
