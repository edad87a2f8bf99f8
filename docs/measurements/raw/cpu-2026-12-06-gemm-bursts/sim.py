import json, statistics as st, sys, random
out=json.load(open(sys.argv[1])); xs=[o[1] for o in out]; ts=[o[0] for o in out]
n=len(xs); rate=n/ts[-1]
def cur(i):  # current: 21 contiguous batches, median of best-of-3
    w=xs[i:i+21]; return st.median([min(w[j:j+3]) for j in range(0,21,3)])
def spread(i, W, q=0.2):  # W seconds of batches, lower quantile
    k=int(W*rate); w=sorted(xs[i:i+k]); return w[int(q*len(w))]
def spread_min_groups(i, W, groups=7):
    k=int(W*rate); w=xs[i:i+k]; g=len(w)//groups
    # sample j = min over batches j, j+groups, ... (spaced through the window)
    return st.median([min(w[j::groups]) for j in range(groups)])
def summ(name,f,span):
    vals=[f(i) for i in range(0,n-int(span*rate)-1,max(1,int(rate*0.5)))]
    m=st.median(vals); mad=st.median([abs(v-m) for v in vals])
    print(f"{name:28s} n={len(vals):4d} median={m:7.1f} robust_cv={1.4826*mad/m*100:5.1f}% max/med={max(vals)/m:5.2f} p95/med={sorted(vals)[int(.95*len(vals))]/m:5.2f}")
summ("current 21x10ms", cur, 0.3)
for W in (1,2,3,5):
    summ(f"p20 over {W}s", lambda i: spread(i,W), W)
    summ(f"min-groups over {W}s", lambda i: spread_min_groups(i,W), W)
