// What one look at an empty POSIX message queue costs, three ways, 200,000 times each: an
// mq_timedreceive with a deadline long past on a blocking descriptor (how MessageQueue's
// receiveIfReady looks), the same call on an O_NONBLOCK descriptor, and poll(2) with a zero
// timeout (how the C spinning floor looks). For Reports/message-port-spinning; not built by the
// package:
//
//   cc -O2 -o /tmp/empty-poll Reports/message-port-spinning/empty-poll.c -lrt && taskset -c 0 /tmp/empty-poll
#define _GNU_SOURCE
#include <mqueue.h>
#include <stdio.h>
#include <time.h>
#include <fcntl.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(void){
  struct mq_attr a={.mq_maxmsg=8,.mq_msgsize=1024};
  mq_unlink("/mqtest"); mqd_t q=mq_open("/mqtest",O_CREAT|O_RDWR,0600,&a); if(q<0){perror("mq_open");return 1;}
  mqd_t qn=mq_open("/mqtest",O_RDWR|O_NONBLOCK);
  char buf[1024]; int n=200000; struct timespec past={0,0};
  double t0=now(); for(int i=0;i<n;i++){ if(mq_timedreceive(q,buf,sizeof buf,NULL,&past)>=0||errno!=ETIMEDOUT){printf("?\n");} } double t1=now();
  for(int i=0;i<n;i++){ if(mq_timedreceive(qn,buf,sizeof buf,NULL,NULL)>=0||errno!=EAGAIN){printf("?? %s\n",strerror(errno));break;} } double t2=now();
  for(int i=0;i<n;i++){ struct pollfd p={.fd=q,.events=POLLIN}; poll(&p,1,0);} double t3=now();
  printf("past deadline: %.0f ns, O_NONBLOCK: %.0f ns, poll 0: %.0f ns\n",(t1-t0)/n,(t2-t1)/n,(t3-t2)/n);
  mq_unlink("/mqtest"); return 0; }
