/*
 * Out-of-line copies of DPDK's `static inline` fast-path functions, so that
 * Rust can call them. Each is a one-line pass-through; see shim.h.
 */
#include "shim.h"

int shim_rte_errno(void) { return rte_errno; }
unsigned int shim_lcore_id(void) { return rte_lcore_id(); }
uint64_t shim_get_tsc_cycles(void) { return rte_get_tsc_cycles(); }

uint16_t shim_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t shim_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

uint16_t shim_eth_tx_prepare(uint16_t port_id, uint16_t queue_id,
			     struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_prepare(port_id, queue_id, tx_pkts, nb_pkts);
}

struct rte_mbuf *shim_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int shim_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs,
			    unsigned int count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

const char *shim_mempool_ops_name(const struct rte_mempool *mp)
{
	return rte_mempool_get_ops(mp->ops_index)->name;
}

void shim_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
void *shim_pktmbuf_mtod(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }
uint16_t shim_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }
uint16_t shim_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }
char *shim_pktmbuf_append(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_append(m, len); }
char *shim_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_prepend(m, len); }
char *shim_pktmbuf_adj(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_adj(m, len); }
int shim_pktmbuf_trim(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_trim(m, len); }

int shim_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail)
{
	return rte_pktmbuf_chain(head, tail);
}

int shim_pktmbuf_is_writable(const struct rte_mbuf *m)
{
	return RTE_MBUF_DIRECT(m) && rte_mbuf_refcnt_read(m) == 1;
}

char *shim_pktmbuf_append_own(struct rte_mbuf *m, uint16_t len)
{
	struct rte_mbuf *last = rte_pktmbuf_lastseg(m);

	if (!(RTE_MBUF_DIRECT(last) && rte_mbuf_refcnt_read(last) == 1))
		return NULL;
	return rte_pktmbuf_append(m, len);
}

uint16_t shim_pktmbuf_data_room_size(struct rte_mempool *mp)
{
	return rte_pktmbuf_data_room_size(mp);
}

void shim_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr,
				rte_iova_t buf_iova, uint16_t buf_len,
				struct rte_mbuf_ext_shared_info *shinfo)
{
	rte_pktmbuf_attach_extbuf(m, buf_addr, buf_iova, buf_len, shinfo);
}

uint16_t shim_mbuf_refcnt_read(const struct rte_mbuf *m) { return rte_mbuf_refcnt_read(m); }

uint16_t shim_mbuf_refcnt_update(struct rte_mbuf *m, int16_t value)
{
	return rte_mbuf_refcnt_update(m, value);
}

void shim_mbuf_set_tx_lens(struct rte_mbuf *m, uint8_t l2_len, uint16_t l3_len,
			   uint8_t l4_len)
{
	m->l2_len = l2_len;
	m->l3_len = l3_len;
	m->l4_len = l4_len;
}

/* TCP segmentation: the header lengths, the payload bytes of each segment
 * the device cuts, and the flags (IPv4 header checksum, TCP checksum and
 * segmentation) DPDK asks for together. */
void shim_mbuf_set_tso(struct rte_mbuf *m, uint8_t l2_len, uint16_t l3_len,
		       uint8_t l4_len, uint16_t tso_segsz)
{
	m->l2_len = l2_len;
	m->l3_len = l3_len;
	m->l4_len = l4_len;
	m->tso_segsz = tso_segsz;
	m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM |
		       RTE_MBUF_F_TX_TCP_CKSUM | RTE_MBUF_F_TX_TCP_SEG;
}

unsigned int shim_ring_enqueue_burst(struct rte_ring *r, void *const *objs,
				     unsigned int n)
{
	return rte_ring_enqueue_burst(r, objs, n, NULL);
}

unsigned int shim_ring_dequeue_burst(struct rte_ring *r, void **objs,
				     unsigned int n)
{
	return rte_ring_dequeue_burst(r, objs, n, NULL);
}

unsigned int shim_ring_count(const struct rte_ring *r) { return rte_ring_count(r); }

uint32_t shim_softrss(uint32_t *input_tuple, uint32_t input_len,
		      const uint8_t *rss_key)
{
	return rte_softrss(input_tuple, input_len, rss_key);
}
