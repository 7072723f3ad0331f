"""The report page's style sheet and script, inlined into every ``report.html`` (:mod:`.page`): text, not code.

The script draws the data-flow graph with the vendored dagre layout and opens the details a link points at; the
page reads without it. Kept apart from the renderer so that its long lines of CSS/JS do not mix with Python.
"""

CSS = """
:root{--bad:#c62828;--badbg:#fdecea;--stop:#e65100;--stopbg:#fff3e0;--ok:#2e7d32;--okbg:#e8f5e9;--ink:#1f2328;
--muted:#656d76;--line:#d0d7de;--card:#fff;--bg:#f6f8fa;--input:#5e35b1;--inputbg:#f3effb;--mono:ui-monospace,
SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}
header{background:#24292f;color:#fff;padding:10px 24px;display:flex;gap:18px;align-items:baseline;flex-wrap:wrap}
header .brand{font-weight:700;font-size:17px;letter-spacing:.3px}
header .sub{color:#d0d7de;font-size:12px}header code{color:#fff;background:#3b434b}
main{max-width:1180px;margin:0 auto;padding:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 18px;margin:0 0 16px}
h2{font-size:18px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 6px}h4{font-size:13px;margin:14px 0 4px}
.verdict.bad{border-left:6px solid var(--bad)}.verdict.ok{border-left:6px solid var(--ok)}
.verdict.warn{border-left:6px solid var(--stop)}.verdict.bad h2{color:var(--bad)}
code,pre{font-family:var(--mono);font-size:12.5px}code{background:#eff1f3;padding:1px 4px;border-radius:4px}
pre{margin:0;white-space:pre-wrap;word-break:break-word}
table{border-collapse:collapse}
.facts th{text-align:left;color:var(--muted);font-weight:500;padding:2px 14px 2px 0;vertical-align:top;
white-space:nowrap}.facts td{padding:2px 0}
.muted{color:var(--muted)}.small{font-size:12px}
.where{margin:12px 0}.where .file{font-family:var(--mono);font-size:12.5px;color:#0969da}
.code{width:100%;border:1px solid var(--line);border-radius:6px;margin-top:4px;background:#f6f8fa}
.code td{padding:1px 8px}.code .ln{color:var(--muted);text-align:right;width:1%;font-family:var(--mono);
font-size:12px;user-select:none}.code tr.hit{background:#fff8c5}.code tr.hit .ln{color:var(--ink);font-weight:700}
.stats{margin:10px 0;font-size:12.5px;width:100%}.stats th,.stats td{border-bottom:1px solid #eaeef2;
padding:3px 8px;text-align:right;white-space:nowrap}.stats th:first-child,.stats td:first-child{text-align:left}
.stats th{background:#f6f8fa;font-weight:600}.stats td.bad{color:var(--bad);font-weight:700}
.stats tr.badrow td:first-child{color:var(--bad)}.nodes td:nth-child(2),.nodes td:nth-child(3){text-align:left}
.hint{margin-top:12px;padding:10px 14px;background:#f6f8fa;border-radius:6px;border:1px solid var(--line)}
.hint h3{margin-top:0}.hint p{margin:4px 0}.hint-lead{font-weight:500}
.diff{margin:6px 0;width:100%;font-family:var(--mono)}.diff th{width:3.5em;text-align:left;padding:2px 8px;
font-size:12px}.diff td{padding:2px 8px}.diff tr.now{background:#ffebe9}.diff tr.now th{color:var(--bad)}
.diff tr.fix{background:#dafbe1}.diff tr.fix th{color:var(--ok)}.diff tr.or{background:#ddf4ff}
.then{margin:10px 0;padding:6px 10px;background:var(--stopbg);border-radius:6px}
.legend{display:flex;flex-wrap:wrap;gap:14px;font-size:12px;color:var(--muted);margin-bottom:8px}
.lg::before{content:"";display:inline-block;width:14px;height:10px;margin-right:5px;border-radius:2px;
vertical-align:-1px;border:2px solid #8c959f;background:#fff}
.lg.culprit::before{border-color:var(--bad);background:var(--badbg);border-width:3px}
.lg.stop::before{border-color:var(--stop);background:var(--stopbg);border-width:3px}
.lg.received::before{border-color:#1565c0;background:#e3f2fd;border-width:3px}
.lg.first::before{border-color:var(--bad);border-width:2px}
.lg.reached::before{border-color:#e57373;background:var(--badbg)}.lg.input::before{border-color:var(--input);
background:var(--inputbg);border-radius:8px}.lg.edge-bad::before{height:0;border:0;border-top:3px solid var(--bad);
background:none}.lg.edge-ok::before{height:0;border:0;border-top:2px solid #8c959f;background:none}
.lg.edge-unk::before{height:0;border:0;border-top:2px dashed #8c959f;background:none}
figure.flow{margin:0 0 14px}figcaption{font-size:12.5px;color:var(--muted);margin-bottom:6px}
.graph{overflow-x:auto;border:1px solid #eaeef2;border-radius:6px;background:#fcfcfd;min-height:60px}
.graph svg{display:block;margin:0 auto;max-width:100%;height:auto}
svg .node rect{fill:#fff;stroke:#8c959f;stroke-width:1.2}svg .node.bad rect{fill:var(--badbg);stroke:#e57373}
svg .node.input rect{fill:var(--inputbg);stroke:var(--input)}svg .node.notread rect{stroke-dasharray:4 3}
svg .node.culprit rect{fill:var(--badbg);stroke:var(--bad);stroke-width:3.5}
svg .node.received rect{fill:#e3f2fd;stroke:#1565c0;stroke-width:3}svg .node.received rect.tagbg{fill:#1565c0}
svg .node.first rect{stroke:var(--bad);stroke-width:2.2}svg .node.first rect.tagbg{fill:#6e7781}
svg .node.stop rect{fill:var(--stopbg);stroke:var(--stop);stroke-width:3.5}
svg .node text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:var(--ink)}
svg .node text.t{font-weight:700;font-size:12.5px}svg .node text.s{fill:var(--muted)}
svg .node text.bad{fill:var(--bad);font-weight:700}svg .node text.tag{font-size:10px;fill:#fff;font-weight:700}
svg .node rect.tagbg{stroke:none;fill:var(--bad)}svg .node.stop rect.tagbg{fill:var(--stop)}
svg .node a text.src{fill:#0969da;text-decoration:underline}
svg .edge path{fill:none;stroke:#8c959f;stroke-width:1.4}svg .edge.bad path{stroke:var(--bad);stroke-width:2.6}
svg .edge.unk path{stroke-dasharray:5 4}svg .edge text{font:10px system-ui,sans-serif;fill:var(--muted)}
.timeline{width:100%;max-width:860px;height:auto;display:block}
.timeline .plot{fill:#fcfcfd;stroke:#eaeef2}.timeline .grid{stroke:#eaeef2}.timeline .tick{font-size:10.5px;
fill:var(--muted)}.timeline .axis{font-size:11px;fill:var(--muted)}.timeline .loss{fill:none;stroke:#0969da;
stroke-width:1.8}.timeline .pt{fill:#0969da}.timeline .failband{fill:var(--bad);opacity:.25}
.timeline .faillabel{fill:var(--bad);font-size:11.5px;font-weight:700}.timeline .badpt{fill:var(--bad);
font-size:11px;font-weight:700}.timeline .kept{stroke:var(--input);stroke-dasharray:3 3}
.timeline .none{fill:var(--muted);font-size:13px}
.checks li{margin:2px 0}
.ranks{width:100%}.ranks th,.ranks td{text-align:left;padding:4px 10px;border-bottom:1px solid #eaeef2}
.ranks tr.role-batch td,.ranks tr.role-local td{color:var(--bad);font-weight:600}
details{border-top:1px solid #eaeef2;padding:6px 0}summary{cursor:pointer;font-weight:600}
.det{padding:6px 0 4px 14px;overflow-x:auto}.msgs li{margin:3px 0}
.passes{font-size:12px;width:100%}.passes td,.passes th{text-align:left;padding:3px 8px;border-bottom:1px solid
#eaeef2;vertical-align:top}
footer{max-width:1180px;margin:0 auto;padding:0 16px 24px;color:var(--muted);font-size:11.5px}
@media print{body{background:#fff;font-size:11px}header{background:#fff;color:#000;border-bottom:2px solid #000}
header .sub,header code{color:#000;background:none}.card{border:1px solid #999;break-inside:avoid;
page-break-inside:avoid}.graph{overflow:visible;border:none}details>summary{list-style:none}
main{max-width:none;padding:0}a{color:inherit}.card#details{break-inside:auto}
details::details-content{content-visibility:visible;display:block}}
"""

JS = r"""
(function(){
"use strict";
var data=JSON.parse(document.getElementById("mg-data").textContent);
var NS="http://www.w3.org/2000/svg",W=236,LINE=15;
function el(name,attrs,parent){var n=document.createElementNS(NS,name);for(var k in attrs){n.setAttribute(k,attrs[k]);}
 if(parent){parent.appendChild(n);}return n;}
function txt(parent,x,y,s,cls){var t=el("text",{x:x,y:y},parent);if(cls){t.setAttribute("class",cls);}t.textContent=s;return t;}
function num(v){if(v===null||v===undefined){return "–";}if(typeof v!=="number"){return String(v);}if(v===0){return "0";}
 var a=Math.abs(v);return (a>=1e5||a<1e-3)?v.toExponential(2):String(Number(v.toPrecision(4)));}
function fit(s,n){s=String(s||"");return s.length>n?"…"+s.slice(s.length-n+1):s;}
function scope(s){var p=String(s||"").split("/").filter(function(x){return x&&x!=="Gradients"&&x!=="Default";});
 return p.slice(-2).join("/");}
function clip(t,max){if(!t.getComputedTextLength){return;}var s=t.textContent,n=0;
 while(t.getComputedTextLength()>max&&s.length>4&&n<200){s=s.slice(1);t.textContent="…"+s;n++;}}
function stats(s){var out=[];if(!s){return out;}
 var head=(s.shape?"["+s.shape.join(",")+"] ":"")+(s.dtype||"");if(head){out.push([head,"s"]);}
 if(s.min!==undefined||s.max!==undefined){if(s.min!==undefined&&(s.min!==null||s.max!==null)){out.push(["min "+num(s.min)+"  max "+num(s.max),""]);}
  else if(s.absmax!==undefined&&s.absmax!==null){out.push(["max |x| "+num(s.absmax),""]);}}
 var c=[];if(s.zeros!==undefined&&s.zeros!==null){c.push(["zeros "+s.zeros,""]);}
 [["nan","NaN"],["pos_inf","+Inf"],["neg_inf","-Inf"]].forEach(function(p){var n=s[p[0]]||0;if(n){c.push([p[1]+" "+n,"bad"]);}});
 if(!c.some(function(x){return x[1]==="bad";})&&s.nan!==undefined){c.push(["no NaN/Inf",""]);}
 c.forEach(function(x){out.push(x);});return out;}
function lines(n){var L=[];
 if(n.kind==="op"){L.push([n.op_type+(n.direction==="backward"?"  (backward)":""),"t"]);L.push([scope(n.scope)||"(top level)","s"]);}
 else{L.push([fit(n.name,40),"t"]);L.push([n.kind==="batch"?"batch input":"Parameter","s"]);}
 var outs=n.outputs||[];if(n.value){outs=[n.value];}
 var io="output";
 if(n.role==="stop"&&n.inputs&&n.inputs.length){L.push(["did not complete; its inputs:","s"]);outs=n.inputs;io="input";}
 outs.slice(0,2).forEach(function(o,i){if(outs.length>1||io==="input"){L.push([io+" "+(o.slot!==undefined?o.slot:i),"s"]);}
  stats(o).forEach(function(x){L.push(x);});});
 if(outs.length>2){L.push(["+"+(outs.length-2)+" more "+io+"s","s"]);}
 if(!n.dumped&&n.role!=="stop"){L.push(["not dumped","s"]);}
 if(n.more_inputs){L.push(["▲ more producers not drawn","s"]);}
 if(n.origin){var t=n.origin.split(" -- ")[0].replace(/^batch column /,"");
  L.push(["origin: "+(t.length>56?t.slice(0,55)+"…":t),"bad"]);}
 return L;}
function draw(flow,box,g){
 var G=new dagre.graphlib.Graph({multigraph:true});
 G.setGraph({rankdir:"TB",nodesep:22,ranksep:46,edgesep:12,marginx:8,marginy:8});
 G.setDefaultEdgeLabel(function(){return {};});
 var byId={};flow.nodes.forEach(function(n,i){n._i=i;byId[n.id]=n;var L=lines(n);n._lines=L;
  var extra=(n.source?LINE:0)+((["culprit","stop","received","first_nonfinite"].indexOf(n.role)>=0)?16:0);
  G.setNode(n.id,{width:W,height:12+L.length*LINE+extra});});
 flow.edges.forEach(function(ed,i){if(byId[ed.from]&&byId[ed.to]){G.setEdge(ed.from,ed.to,{minlen:ed.elided?2:1},"e"+i);}});
 dagre.layout(G);
 var gi=G.graph(),svg=el("svg",{viewBox:"0 0 "+Math.ceil(gi.width)+" "+Math.ceil(gi.height),width:Math.ceil(gi.width),
  role:"img","aria-label":"data flow around the culprit"});
 box.appendChild(svg);
 var defs=el("defs",{},svg);[["ok","#8c959f"],["bad","#c62828"]].forEach(function(m){
  var mk=el("marker",{id:"arrow-"+m[0]+"-"+g,viewBox:"0 0 10 10",refX:9,refY:5,markerWidth:7,markerHeight:7,orient:"auto"},defs);
  el("path",{d:"M0,0L10,5L0,10z",fill:m[1]},mk);});
 flow.edges.forEach(function(ed,i){var info=G.edge(ed.from,ed.to,"e"+i);if(!info){return;}
  var cls="edge"+(ed.nonfinite?" bad":"")+((ed.nonfinite===null||ed.elided)?" unk":"");
  var grp=el("g",{"class":cls},svg),p=info.points,d="M"+p[0].x+","+p[0].y;
  for(var k=1;k<p.length;k++){d+="L"+p[k].x+","+p[k].y;}
  el("path",{d:d,"marker-end":"url(#arrow-"+(ed.nonfinite?"bad":"ok")+"-"+g+")"},grp);
  var t=el("title",{},grp);t.textContent=(ed.elided?"elided: ops not drawn between these":"slot "+ed.out_slot+" → input "+ed.slot)+
   (ed.nonfinite?" (non-finite)":ed.nonfinite===false?" (finite)":" (not read)");
  if(ed.elided){var mid=p[Math.floor(p.length/2)];txt(grp,mid.x+6,mid.y,"⋯ more ops","");}});
 flow.nodes.forEach(function(n){var box2=G.node(n.id);if(!box2){return;}
  var x=box2.x-box2.width/2,y=box2.y-box2.height/2;
  var cls="node "+(n.kind==="op"?"":"input ")+(n.role==="culprit"?"culprit ":"")+(n.role==="stop"?"stop ":"")+
   (n.role==="received"?"received ":"")+(n.role==="first_nonfinite"?"first ":"")+
   (n.nonfinite?"bad ":"")+(n.dumped||n.role==="stop"?"":"notread ");
  var grp=el("g",{"class":cls.trim(),"data-id":n.id,"data-role":n.role,transform:"translate("+x+","+y+")"},svg);
  var tt=el("title",{},grp);tt.textContent=(n.name||"")+(n.index!==null&&n.index!==undefined?" (launch "+n.index+")":"");
  el("rect",{width:box2.width,height:box2.height,rx:n.kind==="op"?6:14},grp);
  var yy=16;
  var tags={culprit:"CULPRIT",stop:"STEP STOPPED HERE",received:"RECEIVED FROM ANOTHER RANK",
   first_nonfinite:"FIRST OP TO READ IT"};
  if(tags[n.role]){var lab=tags[n.role];
   el("rect",{"class":"tagbg",x:8,y:5,width:lab.length*7+10,height:14,rx:3},grp);txt(grp,13,16,lab,"tag");yy=32;}
  n._lines.forEach(function(L){clip(txt(grp,10,yy,L[0],L[1]),box2.width-18);yy+=LINE;});
  if(n.source){var key=n.source.file+":"+n.source.line,known=data.sources[key];
   var a=el("a",{href:"#"+(known?known.anchor:"node-"+g+"-"+n._i)},grp);
   var label=known?known.label:(String(n.source.file).split("/").pop()+":"+n.source.line);
   clip(txt(a,10,yy,"↳ "+label,"src"),box2.width-18);var st=el("title",{},a);st.textContent=n.source.file+":"+n.source.line+"  "+(n.source.code||"");}
 });}
function run(){if(typeof dagre==="undefined"){return;}
 (data.graphs||[]).forEach(function(flow,g){var box=document.getElementById("graph-"+g);if(box&&flow&&flow.nodes&&flow.nodes.length){
  try{draw(flow,box,g);}catch(err){box.textContent="The graph could not be drawn: "+err;}}});}
run();
function reveal(){var id=decodeURIComponent(location.hash.slice(1));var t=id&&document.getElementById(id);
 for(var p=t;p;p=p.parentElement){if(p.tagName==="DETAILS"){p.open=true;}}if(t){t.scrollIntoView();}}
window.addEventListener("hashchange",reveal);
window.addEventListener("beforeprint",function(){document.querySelectorAll("details").forEach(function(d){d.open=true;});});
})();
"""
