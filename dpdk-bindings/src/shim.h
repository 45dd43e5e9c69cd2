/*
 * The DPDK headers the bindings cover, and out-of-line wrappers (shim.c)
 * for the `static inline` fast-path functions and macros that bindgen cannot
 * bind. Each wrapper does exactly what the DPDK function of the same name
 * does; a call costs about a nanosecond, negligible per burst of 32.
 */
#ifndef IWARP_DPDK_SHIM_H
#define IWARP_DPDK_SHIM_H

#include <stdint.h>

#include <rte_config.h>
#include <rte_common.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_memory.h>
#include <rte_dev.h>
#include <rte_bus.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_ethdev.h>
#include <rte_eth_ring.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_tcp.h>
#include <rte_thash.h>

/*
 * Flag values defined through function-like macros (RTE_BIT64), which
 * bindgen does not expand: re-exported as constants it can evaluate.
 */
static const uint64_t SHIM_ETH_RX_OFFLOAD_IPV4_CKSUM = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
static const uint64_t SHIM_ETH_RX_OFFLOAD_TCP_CKSUM = RTE_ETH_RX_OFFLOAD_TCP_CKSUM;
static const uint64_t SHIM_ETH_RX_OFFLOAD_SCATTER = RTE_ETH_RX_OFFLOAD_SCATTER;
static const uint64_t SHIM_ETH_RX_OFFLOAD_RSS_HASH = RTE_ETH_RX_OFFLOAD_RSS_HASH;
static const uint64_t SHIM_ETH_TX_OFFLOAD_IPV4_CKSUM = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
static const uint64_t SHIM_ETH_TX_OFFLOAD_TCP_CKSUM = RTE_ETH_TX_OFFLOAD_TCP_CKSUM;
static const uint64_t SHIM_ETH_TX_OFFLOAD_MULTI_SEGS = RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
static const uint64_t SHIM_ETH_TX_OFFLOAD_TCP_TSO = RTE_ETH_TX_OFFLOAD_TCP_TSO;
static const uint64_t SHIM_ETH_TX_OFFLOAD_MBUF_FAST_FREE = RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE;
static const uint64_t SHIM_ETH_RSS_IPV4 = RTE_ETH_RSS_IPV4;
static const uint64_t SHIM_ETH_RSS_NONFRAG_IPV4_TCP = RTE_ETH_RSS_NONFRAG_IPV4_TCP;
static const uint64_t SHIM_ETH_RSS_IP = RTE_ETH_RSS_IP;
static const uint64_t SHIM_ETH_RSS_TCP = RTE_ETH_RSS_TCP;

int shim_rte_errno(void);
unsigned int shim_lcore_id(void);
uint64_t shim_get_tsc_cycles(void);

uint16_t shim_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **rx_pkts, uint16_t nb_pkts);
uint16_t shim_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **tx_pkts, uint16_t nb_pkts);
uint16_t shim_eth_tx_prepare(uint16_t port_id, uint16_t queue_id,
			     struct rte_mbuf **tx_pkts, uint16_t nb_pkts);

struct rte_mbuf *shim_pktmbuf_alloc(struct rte_mempool *mp);
int shim_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs,
			    unsigned int count);
/* The name of the driver behind the pool ("ring_mp_mc", "stack", ...). */
const char *shim_mempool_ops_name(const struct rte_mempool *mp);
void shim_pktmbuf_free(struct rte_mbuf *m);
void *shim_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t shim_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t shim_pktmbuf_tailroom(const struct rte_mbuf *m);
char *shim_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
/* rte_pktmbuf_append if the last segment is direct with a reference
 * count of 1 (its buffer ours to write), else NULL: one call where the
 * check and the append were two. */
char *shim_pktmbuf_append_own(struct rte_mbuf *m, uint16_t len);
char *shim_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *shim_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
int shim_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
int shim_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
int shim_pktmbuf_is_writable(const struct rte_mbuf *m);
uint16_t shim_pktmbuf_data_room_size(struct rte_mempool *mp);
void shim_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr,
				rte_iova_t buf_iova, uint16_t buf_len,
				struct rte_mbuf_ext_shared_info *shinfo);
uint16_t shim_mbuf_refcnt_read(const struct rte_mbuf *m);
uint16_t shim_mbuf_refcnt_update(struct rte_mbuf *m, int16_t value);
void shim_mbuf_set_tx_lens(struct rte_mbuf *m, uint8_t l2_len, uint16_t l3_len,
			   uint8_t l4_len);
void shim_mbuf_set_tso(struct rte_mbuf *m, uint8_t l2_len, uint16_t l3_len,
		       uint8_t l4_len, uint16_t tso_segsz);

unsigned int shim_ring_enqueue_burst(struct rte_ring *r, void *const *objs,
				     unsigned int n);
unsigned int shim_ring_dequeue_burst(struct rte_ring *r, void **objs,
				     unsigned int n);
unsigned int shim_ring_count(const struct rte_ring *r);

uint32_t shim_softrss(uint32_t *input_tuple, uint32_t input_len,
		      const uint8_t *rss_key);

#endif
